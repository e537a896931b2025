// The CLI prints text it got from a server (names, descriptions, error details) with every control
// and bidirectional-formatting character escaped, so stored data from an older version or a hostile
// server cannot move the terminal's cursor, recolour it or reverse text (issue 19).
import assert from "node:assert/strict";
import { mock, test } from "node:test";
import { CliError } from "../../src/cli/errors.js";
import { note, printFields, printJson, printTable, reportError, say, visible } from "../../src/cli/output.js";

/** Every character the CLI must not print raw. */
const RAW =
  // eslint-disable-next-line no-control-regex -- finding control characters is the point
  /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]|[\ud800-\udfff]/u;

const HOSTILE = "a\u0000b\u001b[2Jc\u202ed\u2066e\u009bf\u007fg\u200fh\u061ci\u2028j\nk\tl\rm\ud800n";

/** What a synchronous print wrote to stdout and stderr (restored before the test runner writes again). */
function capture(print: () => void): { stdout: string; stderr: string } {
  const out = { stdout: "", stderr: "" };
  const stdout = mock.method(process.stdout, "write", (chunk: string) => ((out.stdout += chunk), true));
  const stderr = mock.method(process.stderr, "write", (chunk: string) => ((out.stderr += chunk), true));
  try {
    print();
  } finally {
    stdout.mock.restore();
    stderr.mock.restore();
  }
  return out;
}

void test("visible(): controls, DEL, C1, bidi controls, line separators and lone surrogates become escapes", () => {
  assert.equal(
    visible(HOSTILE),
    "a\\0b\\x1b[2Jc\\u202ed\\u2066e\\x9bf\\x7fg\\u200fh\\u061ci\\u2028j\\nk\\tl\\rm\\ud800n",
  );
  // ordinary Unicode, paired surrogates and backslashes are left as they are
  for (const plain of ["café 東京 😀", "C:\\path\\to", "שלום", "plain ascii"])
    assert.equal(visible(plain), plain);
});

void test("tables, fields, notes, lines and errors print no raw control or bidi character", () => {
  const printed = [
    capture(() => printTable(["NAME", "DESCRIPTION"], [[`fn${HOSTILE}`, HOSTILE]])),
    capture(() =>
      printFields([
        ["description", HOSTILE],
        ["tags", `x, ${HOSTILE}`],
      ]),
    ),
    capture(() => note(`note ${HOSTILE}`)),
    capture(() => say(`line ${HOSTILE}`)),
    capture(() =>
      reportError(new CliError(`the API said ${HOSTILE}`, "VALIDATION_FAILED", { hint: HOSTILE }), false),
    ),
  ];
  for (const { stdout, stderr } of printed) {
    const text = stdout + stderr;
    assert.ok(text.length > 0);
    assert.doesNotMatch(text, RAW, JSON.stringify(text));
    assert.match(text, /\\x1b\[2J/);
    assert.match(text, /\\u202e/);
  }
  // one line per row: a newline in a value does not start another
  assert.equal(printed[0].stdout.split("\n").length, 3);
  assert.equal(printed[1].stdout.split("\n").length, 3);
});

void test("table columns line up as printed, escapes counted", () => {
  const { stdout } = capture(() =>
    printTable(
      ["NAME", "ID"],
      [
        ["a\u202eb", "1"],
        ["abcdefgh", "2"],
      ],
    ),
  );
  const lines = stdout.trimEnd().split("\n");
  assert.deepEqual(
    lines.map((l) => l.lastIndexOf(" ") + 1),
    [10, 10, 10],
  );
});

void test("--json: the same values, with DEL, C1, bidi characters and U+2028/U+2029 escaped as \\uXXXX", () => {
  const value = { description: HOSTILE, tags: ["\u202e", "café 😀"] };
  const { stdout } = capture(() => printJson(value));
  assert.doesNotMatch(stdout, RAW);
  assert.match(stdout, /\\u202e/);
  assert.match(stdout, /\\u009b/);
  assert.match(stdout, /café 😀/);
  assert.deepEqual(JSON.parse(stdout), value, "a script reads exactly what the server sent");
  const err = capture(() =>
    reportError(new CliError(`bad ${HOSTILE}`, "VALIDATION_FAILED", { extra: { errors: [HOSTILE] } }), true),
  );
  assert.doesNotMatch(err.stdout + err.stderr, RAW);
});

void test("a configuration file's problems print one per line, each escaped; other errors stay on one line", () => {
  const config = capture(() =>
    reportError(
      new CliError("invalid configuration (f.yaml):\n  - a: bad\n  - b: x\u001b[2J", "CONFIG"),
      false,
    ),
  );
  assert.deepEqual(config.stderr.trimEnd().split("\n"), [
    "callplane: invalid configuration (f.yaml):",
    "  - a: bad",
    "  - b: x\\x1b[2J (CONFIG)",
  ]);
  const api = capture(() => reportError(new CliError("the API said a\nb", "VALIDATION_FAILED"), false));
  assert.equal(api.stderr.trimEnd().split("\n").length, 1);
});
