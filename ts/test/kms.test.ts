/** Key sources and the key manager: files rotated underneath, the environment, staleness. */

import assert from "node:assert/strict";
import { mkdtempSync, renameSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, it } from "node:test";

import { envSource, fileSource, Key, KeyManager, KeyRing, KeyUnavailable, StateCodec } from "../src/index.js";

const T = 1_750_000_000;

function writeRing(path: string, ring: KeyRing): void {
  writeFileSync(path + ".tmp", ring.toJSON(), { mode: 0o600 });
  renameSync(path + ".tmp", path); // atomically, as the Python rotation job writes it
}

describe("key sources and the key manager", () => {
  it("picks up a rotated key file and promotes the new key only after the promotion delay", async () => {
    const path = join(mkdtempSync(join(tmpdir(), "statecodec-ts-")), "keys.json");
    const old = new Key("old", new Uint8Array(32).fill(1), T - 100_000);
    writeRing(path, new KeyRing([old], "old"));
    let now = T;
    const manager = await KeyManager.start(fileSource(path), { refreshInterval: 30, clock: () => now });
    try {
      assert.equal(manager.signingKey().kid, "old");
      const fresh = new Key("new", new Uint8Array(32).fill(2), T);
      writeRing(path, new KeyRing([old, fresh], "new"));
      await manager.refresh();
      // Verifies at once, mints from created_at + D (D = 30 * 1.1 + 60 + 1 = 94 s).
      assert.equal(manager.timeline.promotionDelay, 94);
      const codec = new StateCodec(manager, { clock: () => now });
      assert.equal(codec.open(new StateCodec(new KeyRing([fresh], "new"), { clock: () => now }).seal("x")).kid, "new");
      assert.equal(manager.signingKey().kid, "old");
      now = T + 94;
      assert.equal(manager.signingKey().kid, "new");
      // The replaced key verifies until D + M after its successor's creation.
      const retiresAt = manager.keyring().get("old")?.retiresAt;
      assert.equal(retiresAt, T + 94 + Math.ceil(900 + 600 + 0 + 1));
    } finally {
      manager.stop();
    }
  });

  it("keeps the last good ring when the source fails, and stops minting once it is stale", async () => {
    let now = T;
    let fail = false;
    const ring = KeyRing.generate("k1");
    const errors: unknown[] = [];
    const manager = await KeyManager.start(async () => {
      if (fail) throw new Error("source down");
      return ring;
    }, { refreshInterval: 60, clock: () => now, onError: (e) => errors.push(e) });
    fail = true;
    await assert.rejects(manager.refresh(), /source down/);
    assert.equal(manager.signingKey().kid, "k1");
    now = T + 901;
    assert.throws(() => manager.signingKey(), KeyUnavailable);
    assert.equal(manager.keyring().get("k1")?.kid, "k1");
    manager.stop();
  });

  it("reads a bare secret or a ring JSON from the environment, never echoing a bad value", async () => {
    const secret = Buffer.alloc(32, 7).toString("base64url");
    const ring = await envSource("SC_KEYS", { SC_KEYS: ` ${secret}\n` })();
    assert.deepEqual([ring.primaryKid, ring.keys[0]?.createdAt], ["k0", 0]);
    const json = await envSource("SC_KEYS", { SC_KEYS: KeyRing.generate("j1").toJSON() })();
    assert.equal(json.primaryKid, "j1");
    await assert.rejects(envSource("SC_KEYS", { SC_KEYS: "not-a-secret-value" })(), (e: Error) => !e.message.includes("not-a-secret-value"));
    await assert.rejects(envSource("SC_KEYS", {})(), /not set/);
  });
});
