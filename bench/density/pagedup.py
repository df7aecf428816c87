#!/usr/bin/env python3
"""What a paused sandbox's pages.img would cost on disk if the host kept
its pages by content (4 KiB pages, each stored once), over a sample of a
density run's paused sandboxes: bytes of pages first seen per sandbox,
and how many of its pages the warm image already holds."""
import hashlib, os, random, sys
root = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
ids = sorted(os.listdir(root))
random.seed(1)
sample = random.sample(ids, min(n, len(ids)))
base = next(f for f in os.listdir(os.path.join(root, sample[0])) if f.startswith('base-'))
b = open(os.path.join(root, sample[0], base), 'rb').read()
seen = set(hashlib.blake2b(b[i:i+4096], digest_size=16).digest() for i in range(0, len(b), 4096))
in_base = total = new = ckpt = 0
rows = []
for k, d in enumerate(sample, 1):
    p = open(os.path.join(root, d, 'pages.img'), 'rb').read()
    ckpt += os.path.getsize(os.path.join(root, d, 'checkpoint.img'))
    for i in range(0, len(p), 4096):
        h = hashlib.blake2b(p[i:i+4096], digest_size=16).digest()
        total += 1
        if h in seen:
            continue
        seen.add(h)
        new += 1
    if k in (1, 10, 100, 1000, 2000, 5000, 10000) or k == len(sample):
        rows.append((k, total * 4096 / k / 1e6, new * 4096 / k / 1e6, ckpt / k / 1e6))
print("| sandboxes (random sample) | pages.img per sandbox | pages first seen, per sandbox (the warm image's counted as seen) | checkpoint.img per sandbox |")
print("|---:|---:|---:|---:|")
for k, t, nw, c in rows:
    print(f"| {k} | {t:.2f} MB | {nw:.2f} MB | {c:.2f} MB |")
