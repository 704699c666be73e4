// args.js — the schedule form's args skeleton, from an effect's JSON schema (pure; tested
// by tests/web/js/args.test.mjs).
//
// The box is pre-filled only with args the schema accepts: defaults, examples, constants,
// and neutral values ("", 0, false, [], {}) where the field's limits allow them. A required
// field without such a value (a string of at least one character, say) is not invented:
// the box stays empty, the skeleton shows as its placeholder and the hint names the field.

const NONE = Symbol("no valid value");

function neutral(p) {
  if (!p || typeof p !== "object") return NONE;
  if ("default" in p) return p.default;
  if (Array.isArray(p.examples) && p.examples.length) return p.examples[0];
  if ("const" in p) return p.const;
  if (Array.isArray(p.enum) && p.enum.length) return p.enum[0];
  for (const key of ["anyOf", "oneOf"]) {
    if (Array.isArray(p[key])) {
      for (const option of p[key]) {
        const v = neutral(option);
        if (v !== NONE) return v;
      }
      return NONE;
    }
  }
  const type = Array.isArray(p.type) ? p.type[0] : p.type;
  switch (type) {
    case "string":
      return (p.minLength || 0) > 0 || p.pattern || p.format ? NONE : "";
    case "integer":
    case "number": {
      let v = 0;
      if (Number.isFinite(p.minimum)) v = Math.max(v, p.minimum);
      if (Number.isFinite(p.exclusiveMinimum) && v <= p.exclusiveMinimum) v = p.exclusiveMinimum + 1;
      if (Number.isFinite(p.maximum) && v > p.maximum) return NONE;
      return v;
    }
    case "boolean":
      return false;
    case "null":
      return null;
    case "array":
      return (p.minItems || 0) > 0 ? NONE : [];
    case "object":
      return Array.isArray(p.required) && p.required.length ? NONE : {};
    default:
      return NONE;
  }
}

function limits(p) {
  const out = [];
  if (Number.isFinite(p.minLength) || Number.isFinite(p.maxLength)) {
    const lo = p.minLength ?? 0;
    out.push(Number.isFinite(p.maxLength) ? `${lo} to ${p.maxLength} characters` : `at least ${lo} characters`);
  }
  if (Number.isFinite(p.minimum)) out.push(`≥ ${p.minimum}`);
  if (Number.isFinite(p.maximum)) out.push(`≤ ${p.maximum}`);
  return out.join(", ");
}

/**
 * The args to offer for an effect.
 *
 * Returns `{text, placeholder, needs}`: `text` goes in the box ("" when the effect takes no
 * args, or when a required field has no value the schema accepts); `placeholder` shows the
 * skeleton with "…" for those fields; `needs` lists them as `{name, description, limits}`.
 */
export function argsSkeleton(schema) {
  if (!schema || typeof schema !== "object") {
    return { text: "", placeholder: "no arguments (sent as null)", needs: [] };
  }
  const props = schema.properties;
  if (!props || typeof props !== "object" || !Object.keys(props).length) {
    return { text: "{}", placeholder: "{}", needs: [] };
  }
  const required = new Set(Array.isArray(schema.required) ? schema.required : []);
  const filled = {};
  const shown = {};
  const needs = [];
  for (const [name, p] of Object.entries(props)) {
    const v = neutral(p);
    if (v !== NONE) {
      filled[name] = v;
      shown[name] = v;
    } else if (required.has(name)) {
      needs.push({ name, description: (p && p.description) || "", limits: p ? limits(p) : "" });
      shown[name] = "…";
    }
  }
  return {
    text: needs.length ? "" : JSON.stringify(filled, null, 2),
    placeholder: JSON.stringify(shown, null, 2),
    needs,
  };
}

/** Whether `text` differs from what the box offers for `schema` (ignoring layout). */
export function argsEdited(schema, text) {
  const typed = text.trim();
  const offered = argsSkeleton(schema).text.trim();
  if (!typed || typed === offered) return false;
  try {
    return JSON.stringify(JSON.parse(typed)) !== JSON.stringify(JSON.parse(offered || "null"));
  } catch {
    return true;
  }
}
