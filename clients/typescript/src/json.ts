// JSON of the client's results. Ids and seqs are bigint (they pass 2^53),
// which JSON.stringify refuses ("Do not know how to serialize a BigInt");
// jsonReplacer writes them as decimal strings, the API's own JSON form
// (docs/API.md), and bodies (Uint8Array) as base64, as the API does.

/**
 * jsonReplacer for JSON.stringify: bigint -> decimal string, Uint8Array ->
 * base64 string; everything else as JSON.stringify writes it (a Date as its
 * ISO string). `JSON.stringify(result, jsonReplacer)`.
 */
export function jsonReplacer(_key: string, value: unknown): unknown {
  if (typeof value === "bigint") {
    return value.toString();
  }
  if (value instanceof Uint8Array) {
    return Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString("base64");
  }
  return value;
}

/** toJSON is JSON.stringify(value, jsonReplacer, space). */
export function toJSON(value: unknown, space?: number | string): string {
  return JSON.stringify(value, jsonReplacer, space);
}
