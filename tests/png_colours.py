"""Count the pixels of a PNG screenshot near each given colour, with the standard library only
(zlib): what tests/tests/profile.rs uses to check that headless Chromium drew every plot of the
HTML report (each plot's series has a colour of its own).

    python png_colours.py SHOT.png RRGGBB [RRGGBB ...]  ->  one line: RRGGBB=COUNT ...
"""
import struct
import sys
import zlib


def pixels(path):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit("error: not a PNG")
    pos, idat, width, height, ctype = 8, b"", 0, 0, 0
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        pos += 12 + n
        if kind == b"IHDR":
            width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or ctype not in (2, 6) or interlace:
                raise SystemExit(f"error: unsupported PNG (depth {depth}, colour type {ctype}, interlace {interlace})")
        elif kind == b"IDAT":
            idat += body
    bpp = 4 if ctype == 6 else 3
    raw, stride = zlib.decompress(idat), width * bpp
    prev, out = bytearray(stride), []
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out.append(bytes(line))
        prev = line
    return out, bpp


def main(path, colours):
    rows, bpp = pixels(path)
    want = [tuple(int(c[i:i + 2], 16) for i in (0, 2, 4)) for c in colours]
    counts = [0] * len(want)
    for row in rows:
        for x in range(0, len(row), bpp):
            px = row[x], row[x + 1], row[x + 2]
            for k, w in enumerate(want):
                if abs(px[0] - w[0]) + abs(px[1] - w[1]) + abs(px[2] - w[2]) <= 24:
                    counts[k] += 1
    print(" ".join(f"{c}={n}" for c, n in zip(colours, counts)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
