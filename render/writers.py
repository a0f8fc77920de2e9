"""Streaming video writers: every frame goes to the file (or encoder) when it is appended.

.mp4  imageio's ffmpeg writer (imageio-ffmpeg's bundled binary): libx264, yuv420p, quality 7
      (crf 15), preset veryfast; frames must have even width and height. ffmpeg runs in its own
      process group (imageio-ffmpeg), so Ctrl-C does not kill it before the file is finalised.
.gif  written block by block: each frame, with a 4x4 ordered dither against banding, is
      quantised to its own 256-colour palette by Pillow
      (imageio's GIF backend) and appended to the file with its delay (1/fps) and a local
      colour table; the NETSCAPE loop block sets loop=0 (forever). imageio's own GIF writer
      keeps every frame in memory until it closes, which a long video cannot afford.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np

FORMATS = (".mp4", ".gif")


def open_writer(path: Path, fps: float):
    ext = path.suffix.lower()
    if ext == ".mp4":
        return Mp4Writer(path, fps)
    if ext == ".gif":
        return GifStreamWriter(path, fps)
    raise ValueError(f"unsupported video extension {path.suffix!r} for {str(path)!r}; allowed: "
                     + ", ".join(FORMATS))


class Mp4Writer:
    def __init__(self, path: Path, fps: float):
        import imageio.v2 as iio2

        self._writer = iio2.get_writer(
            str(path), format="FFMPEG", mode="I", fps=fps, codec="libx264", pixelformat="yuv420p",
            quality=7, macro_block_size=2, ffmpeg_log_level="error",
            ffmpeg_params=["-preset", "veryfast"])

    def append(self, frame: np.ndarray) -> None:
        if frame.shape[0] % 2 or frame.shape[1] % 2:
            raise ValueError(f"MP4 (yuv420p) frames need even width and height, got {frame.shape[1]}x{frame.shape[0]}")
        self._writer.append_data(frame)

    def close(self) -> None:
        self._writer.close()


def _skip_sub_blocks(data: bytes, pos: int) -> int:
    while True:
        size = data[pos]
        pos += 1
        if size == 0:
            return pos
        pos += size


def _split_single_gif(data: bytes):
    """(colour table bytes, table size bits, LZW image data incl. min code size) of a 1-frame GIF."""
    if data[:6] not in (b"GIF87a", b"GIF89a"):
        raise RuntimeError("the GIF encoder returned something that is not a GIF")
    packed = data[10]
    pos = 13
    table, bits = None, None
    if packed & 0x80:
        bits = packed & 0x07
        size = 3 * (2 ** (bits + 1))
        table = data[pos:pos + size]
        pos += size
    while pos < len(data):
        b = data[pos]
        if b == 0x21:                                   # extension: skip
            pos = _skip_sub_blocks(data, pos + 2)
        elif b == 0x2C:                                 # image descriptor
            ipacked = data[pos + 9]
            pos += 10
            if ipacked & 0x80:
                bits = ipacked & 0x07
                size = 3 * (2 ** (bits + 1))
                table = data[pos:pos + size]
                pos += size
            start = pos
            pos = _skip_sub_blocks(data, pos + 1)
            if table is None:
                raise RuntimeError("GIF frame without a colour table")
            if ipacked & 0x40:
                raise RuntimeError("interlaced GIF frame from the encoder")
            return table, bits, data[start:pos]
        else:
            break
    raise RuntimeError("GIF frame without image data")


_BAYER4 = (np.array([[0, 8, 2, 10], [12, 4, 14, 6], [3, 11, 1, 9], [15, 7, 13, 5]], np.float32) + 0.5) / 16 - 0.5
GIF_DITHER = 8.0   # amplitude (of 255) of the ordered dither that breaks a 256-colour palette's bands


def ordered_dither(rgb: np.ndarray, amplitude: float = GIF_DITHER) -> np.ndarray:
    """A 4x4 Bayer pattern added before quantisation: smooth shading (the sphere) keeps its local
    mean instead of breaking into bands, and the regular pattern costs LZW ~20%, far less than
    error diffusion's noise."""
    h, w = rgb.shape[:2]
    t = np.tile(_BAYER4, (h // 4 + 1, w // 4 + 1))[:h, :w, None]
    return np.clip(rgb.astype(np.float32) + amplitude * t, 0, 255).round().astype(np.uint8)


class GifStreamWriter:
    def __init__(self, path: Path, fps: float):
        self._fp = open(path, "wb")
        self._delay_cs = max(1, int(round(100.0 / fps)))
        self._size = None

    def append(self, frame: np.ndarray) -> None:
        from PIL import Image

        h, w = frame.shape[:2]
        if self._size is None:
            self._size = (w, h)
            self._fp.write(b"GIF89a" + struct.pack("<HHBBB", w, h, 0, 0, 0))
            self._fp.write(b"\x21\xFF\x0BNETSCAPE2.0\x03\x01" + struct.pack("<H", 0) + b"\x00")
        elif (w, h) != self._size:
            raise ValueError(f"GIF frame size {w}x{h} differs from the first frame's {self._size}")
        im = Image.fromarray(ordered_dither(frame[..., :3]), "RGB")
        pim = im.quantize(colors=256, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
        buf = io.BytesIO()
        pim.save(buf, format="GIF", interlace=False)
        table, bits, image_data = _split_single_gif(buf.getvalue())
        # graphic control extension: disposal 1 (leave in place), delay in 1/100 s, no transparency
        self._fp.write(b"\x21\xF9\x04" + struct.pack("<BHB", 1 << 2, self._delay_cs, 0) + b"\x00")
        self._fp.write(b"\x2C" + struct.pack("<HHHHB", 0, 0, w, h, 0x80 | bits) + table)
        self._fp.write(image_data)

    def close(self) -> None:
        if self._fp.closed:
            return
        try:
            if self._size is not None:
                self._fp.write(b"\x3B")
        finally:
            self._fp.close()
