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

/** Wait for a state polled every 20 ms, up to a minute (the machine may be loaded). */
export async function until(ready: () => Promise<boolean>): Promise<void> {
  const deadline = performance.now() + 60_000;
  while (!(await ready())) {
    if (performance.now() > deadline) throw new Error("the state never came");
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}
