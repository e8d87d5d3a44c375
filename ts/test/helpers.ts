import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

/** The repository root: this file runs as ts/dist/test/helpers.js. */
export const REPO_ROOT = fileURLToPath(new URL("../../../", import.meta.url));

export function repoFile(relative: string): string {
  return readFileSync(REPO_ROOT + relative, "utf8");
}

export function hex(bytes: Uint8Array): string {
  return Buffer.from(bytes).toString("hex");
}

export function fromHex(text: string): Uint8Array {
  return new Uint8Array(Buffer.from(text, "hex"));
}
