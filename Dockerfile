# The image of every callplane pod that `callplane render` writes (docs/kubernetes.md):
#   docker build -t callplane:$(node -p 'require("./package.json").version') .
# The built checkout lands at /app (dist/, node_modules/, bin/); each Deployment runs
# node /app/dist/src/services/<service>/main.js. NATS runs its own image (kubernetes.natsImage).
FROM node:20-bookworm-slim AS build
WORKDIR /app
# better-sqlite3 builds from source when no prebuilt binary matches
RUN apt-get update \
  && apt-get install -y --no-install-recommends python3 make g++ \
  && rm -rf /var/lib/apt/lists/*
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --loglevel=error
COPY tsconfig.json ./
COPY src src
COPY examples examples
RUN node_modules/.bin/tsc -p tsconfig.json && npm prune --omit=dev --no-audit --no-fund

FROM node:20-bookworm-slim
WORKDIR /app
ENV NODE_ENV=production
COPY --from=build /app/package.json ./
COPY --from=build /app/node_modules node_modules
COPY --from=build /app/dist dist
COPY bin bin
# the uid the rendered pods run as (runAsUser 1000: the image's node user)
USER 1000:1000
CMD ["node", "/app/dist/src/cli/main.js", "--help"]
