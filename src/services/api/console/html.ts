// HTML as the console writes it: template strings through one tagged template, `html`, which
// escapes every value it is given unless that value is itself Html (made by `html` or `raw`). So a
// function name, a token subject or a replica's error detail can never become markup.
export class Html {
  constructor(readonly text: string) {}
  toString(): string {
    return this.text;
  }
}

const ESCAPES: Record<string, string> = {
  "&": "&amp;",
  "<": "&lt;",
  ">": "&gt;",
  '"': "&quot;",
  "'": "&#39;",
};

/** Text made safe for an element's content and for a quoted attribute value. */
export function escapeHtml(value: unknown): string {
  return String(value).replace(/[&<>"']/g, (c) => ESCAPES[c]);
}

/** Markup that is trusted as it is (the console's own constants only). */
export function raw(text: string): Html {
  return new Html(text);
}

function part(v: unknown): string {
  if (v === undefined || v === null || v === false) return "";
  if (v instanceof Html) return v.text;
  if (Array.isArray(v)) return v.map(part).join("");
  return escapeHtml(v);
}

/** A template whose values are escaped (arrays are joined; undefined, null and false are left out). */
export function html(strings: TemplateStringsArray, ...values: unknown[]): Html {
  let out = strings[0];
  for (let i = 0; i < values.length; i++) out += part(values[i]) + strings[i + 1];
  return new Html(out);
}
