#!/usr/bin/env python3
"""Independent re-implementation of the user-priority hash (admission-core/src/user_hash.rs),
from the SipHash-2-4 specification, to cross-check the known answers pinned in
user_hash/tests.rs. Run: python3 admission-core/src/user_hash/known_answer.py"""

M = (1 << 64) - 1


def rotl(x, b):
    return ((x << b) | (x >> (64 - b))) & M


def siphash24(k0, k1, data, out128=False):
    v0 = 0x736F6D6570736575 ^ k0
    v1 = 0x646F72616E646F6D ^ k1
    v2 = 0x6C7967656E657261 ^ k0
    v3 = 0x7465646279746573 ^ k1
    if out128:
        v1 ^= 0xEE

    def rnd():
        nonlocal v0, v1, v2, v3
        v0 = (v0 + v1) & M; v1 = rotl(v1, 13); v1 ^= v0; v0 = rotl(v0, 32)
        v2 = (v2 + v3) & M; v3 = rotl(v3, 16); v3 ^= v2
        v0 = (v0 + v3) & M; v3 = rotl(v3, 21); v3 ^= v0
        v2 = (v2 + v1) & M; v1 = rotl(v1, 17); v1 ^= v2; v2 = rotl(v2, 32)

    n = len(data)
    end = n - n % 8
    for i in range(0, end, 8):
        m = int.from_bytes(data[i:i + 8], "little")
        v3 ^= m; rnd(); rnd(); v0 ^= m
    b = ((n & 0xFF) << 56) | int.from_bytes(data[end:], "little")
    v3 ^= b; rnd(); rnd(); v0 ^= b
    v2 ^= 0xEE if out128 else 0xFF
    for _ in range(4):
        rnd()
    h1 = v0 ^ v1 ^ v2 ^ v3
    if not out128:
        return h1
    v1 ^= 0xDD
    for _ in range(4):
        rnd()
    return h1, v0 ^ v1 ^ v2 ^ v3


def independent(secret, period, user):
    k0, k1 = siphash24(0, 0, secret + period.to_bytes(8, "little"), True)
    return siphash24(k0, k1, user) % 128


TAG = b"weir-balanced-user-levels-v1"


def balanced(secret, n, period, user):
    cycle, index = period // n, period % n
    key = siphash24(0, 0, TAG + len(secret).to_bytes(8, "little") + secret
                    + n.to_bytes(4, "little") + cycle.to_bytes(8, "little"), True)
    h1, h2 = siphash24(key[0], key[1], user, True)
    base = h1 % 128
    rk = (key[0] ^ h2, rotl(key[1], 17) ^ h2)

    def feistel(x, bits):
        lw, rw = bits // 2, bits - bits // 2
        left, right = x >> rw, x & ((1 << rw) - 1)
        for rnd in range(4):
            f = siphash24(rk[0], rk[1], bytes([rnd]) + right.to_bytes(4, "little"))
            left, right = right, left ^ (f & ((1 << lw) - 1))
            lw, rw = rw, lw
        return (left << rw) | right

    slot = 0
    if n > 1:
        x = index
        while True:
            x = feistel(x, (n - 1).bit_length())
            if x < n:
                slot = x
                break
    return (base + slot * 128 // n) % 128


if __name__ == "__main__":
    k0 = int.from_bytes(bytes(range(8)), "little")
    k1 = int.from_bytes(bytes(range(8, 16)), "little")
    assert siphash24(k0, k1, b"") == 0x726FDB47DD0E0E31  # the specification's test vectors
    assert siphash24(k0, k1, bytes(range(15))) == 0xA129CA6149BE45E5
    secret = b"weir-test-secret"
    print("KNOWN_ANSWER", [independent(secret, 493_000, u.encode()) for u in ["alice", "bob", "carol", "dave"]])
    print("BALANCED_KNOWN_ANSWER",
          [[balanced(secret, 6, p, u.encode()) for p in range(492_998, 493_004)] for u in ["alice", "bob"]])
