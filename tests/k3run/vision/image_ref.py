#!/usr/bin/python3
"""Reference for k3's image preprocessing (k3run/vision/image_*.h), run by image_test.cpp.

The released Kimi K3 processor's rule, written again over Pillow + numpy: PIL.Image.open (no
EXIF transpose), Image.resize(navit size, BICUBIC) in the file's own mode, the transparent
background filled AFTER the resize onto an 8-px chessboard (255 / 180) in float32, black
padding to multiples of 28, (x / 255 - 0.5) / 0.5, patches (c, 14, 14) row-major over the grid.

Commands (all output deterministic):
  small DIR          write the small committed test images (tests/data/images/)
  large DIR          write the large images that exercise the resize (made at test time)
  ref OUT IMAGE...   for each IMAGE write OUT/<file name>.grid ("ow oh rw rh pw ph gh gw
                     tokens"), OUT/<name>.rgb (the padded uint8 RGB, ph x pw x 3) and, when
                     it has at most MAX_FLOAT_PATCHES patches, OUT/<name>.f32 (the patches)
  norm OUT           OUT: float32 normalised value of each uint8 0..255
  grids OUT W H ...  OUT: "w h rw rh gh gw tokens" per (W, H) pair
"""
import math
import os
import sys

import numpy as np
from PIL import Image

PATCH = 14
MERGE = 2
IN_PATCH_LIMIT = 65536
PATCH_LIMIT_ON_ONE_SIDE = 512
MAX_FLOAT_PATCHES = 20000


def navit(width, height):
    """(new_w, new_h, pad_w, pad_h, tokens) of navit_resize_image."""
    s1 = math.sqrt(IN_PATCH_LIMIT / (max(1.0, width // PATCH) * max(1.0, height // PATCH)))
    s2 = PATCH_LIMIT_ON_ONE_SIDE * PATCH / width
    s3 = PATCH_LIMIT_ON_ONE_SIDE * PATCH / height
    scale = min(1.0, s1, s2, s3)
    new_w = min(max(1, int(width * scale)), PATCH_LIMIT_ON_ONE_SIDE * PATCH)
    new_h = min(max(1, int(height * scale)), PATCH_LIMIT_ON_ONE_SIDE * PATCH)
    factor = MERGE * PATCH
    pad_w = (factor - new_w % factor) % factor
    pad_h = (factor - new_h % factor) % factor
    tokens = ((new_h + pad_h) // factor) * ((new_w + pad_w) // factor)
    return new_w, new_h, pad_w, pad_h, tokens


def chessboard(height, width):
    ys = np.arange(height)[:, None] // 8
    xs = np.arange(width)[None, :] // 8
    board = np.where((ys + xs) % 2 == 1, 180, 255).astype(np.uint8)
    return np.repeat(board[:, :, None], 3, axis=2)


def fill_background(image):
    """The transparent-background fill, after the resize: an RGB uint8 array."""
    if image.mode == "RGB":
        return np.asarray(image)
    if not ("A" in image.getbands() or "transparency" in image.info):
        return np.asarray(image.convert("RGB"))
    rgba = np.array(image.convert("RGBA"))
    alpha = np.stack([rgba[:, :, 3].astype(np.float32) / 255.0] * 3, axis=2)
    bg = chessboard(rgba.shape[0], rgba.shape[1])
    return (alpha * rgba[:, :, :3] + (1 - alpha) * bg).astype(np.uint8)


def normalize(x):
    x = (x / 255.0).astype(np.float32)
    x -= np.array([0.5, 0.5, 0.5])
    x *= 1.0 / np.array([0.5, 0.5, 0.5])
    return x


def preprocess(path):
    image = Image.open(path)
    width, height = image.size
    new_w, new_h, pad_w, pad_h, tokens = navit(width, height)
    resized = image.resize((new_w, new_h), resample=Image.Resampling.BICUBIC)
    rgb = np.pad(fill_background(resized), ((0, pad_h), (0, pad_w), (0, 0)))
    ph, pw = rgb.shape[:2]
    grid = (width, height, new_w, new_h, pw, ph, ph // PATCH, pw // PATCH, tokens)
    return grid, rgb


def patchify(rgb):
    x = normalize(rgb[None])
    t, h, w, c = x.shape
    p = x.reshape(t, h // PATCH, PATCH, w // PATCH, PATCH, c).transpose(0, 1, 3, 5, 2, 4)
    return np.ascontiguousarray(p.reshape(-1, c, PATCH, PATCH), dtype=np.float32)


# ---- test images --------------------------------------------------------------------------


def pattern(h, w, seed, channels=3):
    """Smooth colour waves plus a little noise: compresses well, exercises every filter tap."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    planes = []
    for c in range(channels):
        fx, fy = 0.05 + 0.07 * c, 0.09 + 0.03 * c
        v = 127.5 + 100 * np.sin(x * fx + c) * np.cos(y * fy - c) + rng.randint(-20, 21, (h, w))
        planes.append(np.clip(v, 0, 255))
    return np.stack(planes, axis=2).astype(np.uint8)


def alpha_plane(h, w):
    y, x = np.mgrid[0:h, 0:w]
    a = ((x * 7 + y * 13) % 300).astype(np.int64) - 20
    return np.clip(a, 0, 255).astype(np.uint8)  # runs of 0, partial and 255


def palette_image(h, w, seed, trns):
    rng = np.random.RandomState(seed)
    idx = ((np.mgrid[0:h, 0:w][1] // 3 + np.mgrid[0:h, 0:w][0] // 2) % 16).astype(np.uint8)
    idx[rng.rand(h, w) < 0.1] = 3
    im = Image.fromarray(idx, "P")
    im.putpalette(list(rng.randint(0, 256, 16 * 3)))
    if trns:
        im.info["transparency"] = bytes([0, 40, 255, 128] + [255, 200] * 6)
    return im


def write_small(d):
    os.makedirs(d, exist_ok=True)
    rgba = np.dstack([pattern(47, 61, 1), alpha_plane(47, 61)])
    Image.fromarray(rgba, "RGBA").save(f"{d}/rgba_61x47.png")
    Image.fromarray(pattern(33, 45, 2, 1)[:, :, 0], "L").save(f"{d}/gray_45x33.png")
    palette_image(37, 50, 3, True).save(f"{d}/palette_trns_50x37.png", transparency=bytes(
        [0, 40, 255, 128] + [255, 200] * 6))
    palette_image(30, 40, 4, False).save(f"{d}/palette_40x30.png", bits=4)
    Image.fromarray(pattern(17, 30, 5)).save(f"{d}/rgb_30x17.jpg", quality=90)
    Image.fromarray(pattern(17, 30, 6, 1)[:, :, 0], "L").save(f"{d}/gray_30x17.jpg", quality=90)
    Image.fromarray(np.dstack([pattern(20, 24, 7), pattern(20, 24, 8, 1)]), "CMYK").save(
        f"{d}/cmyk_24x20.jpg", quality=90)
    Image.fromarray(np.dstack([pattern(21, 33, 9, 1), alpha_plane(21, 33)]), "LA").save(
        f"{d}/la_33x21.png")
    gray = pattern(20, 20, 10, 1)[:, :, 0]
    gray[5:9, 5:15] = 77
    Image.fromarray(gray, "L").save(f"{d}/gray_trns_20x20.png", transparency=77)
    Image.fromarray(pattern(17, 30, 11)).save(f"{d}/rgb_30x17.png")
    Image.fromarray(np.array([[[200, 30, 90]]], np.uint8)).save(f"{d}/rgb_1x1.png")
    Image.fromarray(pattern(19, 23, 12)).save(f"{d}/interlaced_23x19.png", interlace=1)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 CW to display
    Image.fromarray(pattern(16, 40, 13)).save(f"{d}/exif_rot6_40x16.jpg", exif=exif, quality=90)
    bits = (np.mgrid[0:20, 0:40][1] // 3 + np.mgrid[0:20, 0:40][0] // 4) % 2 == 0
    Image.fromarray(bits).save(f"{d}/bilevel_40x20.png")
    # 16-bit: RGB through Pillow's RGB;16B (high byte); gray is a documented deviation.
    wide = pattern(15, 20, 14).astype(np.uint16) * 257 + 3
    write_png16(f"{d}/rgb16_20x15.png", wide, color_type=2)
    write_gray4(f"{d}/gray4_trns_24x10.png", 10, 24, 0)
    Image.fromarray(pattern(24, 40, 16)).save(f"{d}/progressive_40x24.jpg", quality=90,
                                              progressive=True)
    g16 = pattern(15, 20, 15, 1)[:, :, 0].astype(np.uint16) * 256 + 0xAB
    write_png16(f"{d}/gray16_20x15.png", g16, color_type=0)
    Image.fromarray((g16 >> 8).astype(np.uint8), "L").save(f"{d}/gray16_hi_20x15.png")


def png_chunk(tag, body):
    import struct
    import zlib

    return struct.pack(">I", len(body)) + tag + body + struct.pack(
        ">I", zlib.crc32(tag + body) & 0xFFFFFFFF)


def write_png(path, w, h, depth, color_type, rows, extra=b""):
    """A PNG written by hand from packed scanlines (for kinds Pillow does not write)."""
    import struct
    import zlib

    raw = b"".join(b"\0" + row for row in rows)
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra +
                png_chunk(b"IDAT", zlib.compress(raw, 9)) + png_chunk(b"IEND", b""))


def write_png16(path, samples, color_type):
    """A 16-bit PNG (Pillow writes 16-bit RGB only as 8-bit)."""
    h, w = samples.shape[:2]
    write_png(path, w, h, 16, color_type, [samples[y].astype(">u2").tobytes() for y in range(h)])


def write_gray4(path, h, w, key):
    """A 4-bit gray PNG with a tRNS key (Pillow compares the raw key with the scaled values)."""
    import struct

    v = ((np.mgrid[0:h, 0:w][1] // 2 + np.mgrid[0:h, 0:w][0]) % 16).astype(np.uint8)
    rows = [bytes((v[y, 2 * i] << 4) | (v[y, 2 * i + 1] if 2 * i + 1 < w else 0)
                  for i in range((w + 1) // 2)) for y in range(h)]
    write_png(path, w, h, 4, 0, rows, png_chunk(b"tRNS", struct.pack(">H", key)))


def write_large(d):
    os.makedirs(d, exist_ok=True)
    # Sides over 7,168: downsized by 7168 / side in each direction.
    rgba = np.dstack([pattern(40, 7300, 21), alpha_plane(40, 7300)])
    Image.fromarray(rgba, "RGBA").save(f"{d}/big_rgba_7300x40.png")
    palette_image(30, 7200, 22, True).save(f"{d}/big_palette_7200x30.png", transparency=bytes(
        [0, 40, 255, 128] + [255, 200] * 6))
    Image.fromarray(pattern(7400, 30, 23, 1)[:, :, 0], "L").save(f"{d}/big_gray_30x7400.png")
    Image.fromarray(np.dstack([pattern(20, 7250, 24, 1), alpha_plane(20, 7250)]), "LA").save(
        f"{d}/big_la_7250x20.png")
    Image.fromarray(np.dstack([pattern(16, 7300, 25), pattern(16, 7300, 26, 1)]), "CMYK").save(
        f"{d}/big_cmyk_7300x16.jpg", quality=90)
    gray = pattern(20, 7200, 27, 1)[:, :, 0]
    Image.fromarray(gray, "L").save(f"{d}/big_gray_trns_7200x20.png", transparency=int(gray[3, 3]))
    bits = (np.mgrid[0:20, 0:7200][1] // 3 + np.mgrid[0:20, 0:7200][0] // 4) % 2 == 0
    Image.fromarray(bits).save(f"{d}/big_bilevel_7200x20.png")
    Image.fromarray(pattern(25, 7500, 28)).save(f"{d}/big_rgb_7500x25.jpg", quality=90)
    write_gray4(f"{d}/big_gray4_trns_7210x12.png", 12, 7210, 5)
    # One pass only: a 1-pixel side stays 1 (horizontal only, then vertical only).
    Image.fromarray(pattern(1, 7300, 30)).save(f"{d}/big_rgb_7300x1.png")
    Image.fromarray(np.dstack([pattern(7300, 1, 31), alpha_plane(7300, 1)]), "RGBA").save(
        f"{d}/big_rgba_1x7300.png")
    # Over the 65,536-patch limit: (5000 // 14) * (3000 // 14) = 76,398 patches.
    tile = pattern(300, 500, 29)
    Image.fromarray(np.tile(tile, (10, 10, 1))).save(f"{d}/big_rgb_5000x3000.jpg", quality=85)


def main(argv):
    cmd = argv[1]
    if cmd == "small":
        write_small(argv[2])
    elif cmd == "large":
        write_large(argv[2])
    elif cmd == "ref":
        out = argv[2]
        for path in argv[3:]:
            name = os.path.basename(path)
            grid, rgb = preprocess(path)
            with open(f"{out}/{name}.grid", "w") as f:
                f.write(" ".join(str(v) for v in grid) + "\n")
            rgb.tofile(f"{out}/{name}.rgb")
            if grid[6] * grid[7] <= MAX_FLOAT_PATCHES:
                patchify(rgb).tofile(f"{out}/{name}.f32")
    elif cmd == "norm":
        values = np.repeat(np.arange(256, dtype=np.uint8)[:, None], 3, axis=1)
        normalize(values)[:, 0].astype(np.float32).tofile(argv[2])
    elif cmd == "grids":
        vals = [int(v) for v in argv[3:]]
        with open(argv[2], "w") as f:
            for w, h in zip(vals[0::2], vals[1::2]):
                nw, nh, pw, ph, tokens = navit(w, h)
                f.write(f"{w} {h} {nw} {nh} {(nh + ph) // PATCH} {(nw + pw) // PATCH} {tokens}\n")
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main(sys.argv)
