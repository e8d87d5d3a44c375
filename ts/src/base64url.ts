/**
 * Canonical unpadded base64url (RFC 4648 section 5): every byte string has exactly one
 * spelling, so a token cannot be re-spelled. Node's own decoder is lenient (it skips
 * padding, whitespace and the standard alphabet's + and /), so the text is judged here
 * first and only then handed to it.
 */

const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const BODY = /^[A-Za-z0-9_-]*$/;

export const CUT_SHORT = "looks cut short (no base64url text is 4n+1 characters long: was it truncated?)";

export function b64encode(raw: Uint8Array): string {
  return Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength).toString("base64url");
}

/** Decode canonical unpadded base64url, or throw an Error saying why it is not. */
export function b64decode(text: string): Uint8Array {
  if (!BODY.test(text)) throw new Error("characters outside the unpadded base64url alphabet");
  const rem = text.length % 4;
  if (rem === 1) throw new Error(CUT_SHORT);
  if (rem !== 0) {
    // The unused low bits of the last character must be zero: 4 bits at 2 mod 4, 2 at 3 mod 4.
    const last = ALPHABET.indexOf(text[text.length - 1] as string);
    if (last & (rem === 2 ? 0x0f : 0x03)) throw new Error("non-canonical base64url (trailing bits set)");
  }
  const buf = Buffer.from(text, "base64url");
  return new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
}
