"""Orthographic camera and the pre-rendered look of a shaded unit sphere.

mplot3d is slow, so 3-D views project points themselves: `Camera.project` turns (n, 3) points
into screen x, screen y and depth (positive = toward the viewer). With the light fixed to the
camera, the shaded disk of the sphere does not change when the camera turns; only the
wireframe (meridians and parallels) does.
"""

from __future__ import annotations

import numpy as np

SPHERE_RGB = np.array([0.80, 0.86, 0.93])     # base colour of the sphere surface
LIGHT_DIR = np.array([-0.45, 0.55, 0.70])       # in camera coordinates (right, up, toward viewer)


class Camera:
    """Orthographic camera looking at the origin from elevation `elev` and azimuth `azim` (degrees)."""

    def __init__(self, elev: float = 20.0, azim: float = -60.0):
        self.elev = float(elev)
        self.azim = float(azim)

    def matrix(self) -> np.ndarray:
        """3 x 3 rows: screen right, screen up, toward the viewer."""
        el, az = np.deg2rad(self.elev), np.deg2rad(self.azim)
        toward = np.array([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)])
        right = np.array([-np.sin(az), np.cos(az), 0.0])
        up = np.cross(toward, right)
        return np.stack([right, up, toward])

    def project(self, points: np.ndarray) -> np.ndarray:
        """(..., 3) points -> (..., 3) [screen x, screen y, depth]."""
        return np.asarray(points, float) @ self.matrix().T


def shaded_disk(size: int = 512, base_rgb=SPHERE_RGB, light=LIGHT_DIR) -> np.ndarray:
    """RGBA image (size x size) of a lit unit sphere seen orthographically; transparent outside.

    Lambert diffuse + ambient + a soft specular highlight, an antialiased rim."""
    u = (np.arange(size) + 0.5) / size * 2.0 - 1.0
    X, Y = np.meshgrid(u, -u)                    # image rows go top to bottom
    r2 = X ** 2 + Y ** 2
    Z = np.sqrt(np.clip(1.0 - r2, 0.0, None))
    L = np.asarray(light, float)
    L = L / np.linalg.norm(L)
    lam = np.clip(X * L[0] + Y * L[1] + Z * L[2], 0.0, None)
    H = L + np.array([0.0, 0.0, 1.0])
    H /= np.linalg.norm(H)
    spec = np.clip(X * H[0] + Y * H[1] + Z * H[2], 0.0, None) ** 40
    shade = 0.62 + 0.38 * lam
    rgb = np.clip(np.asarray(base_rgb)[None, None, :] * shade[..., None] + 0.35 * spec[..., None], 0, 1)
    # edge darkening for a rim (limb) and antialiased alpha at the outline
    rgb *= (0.88 + 0.12 * np.sqrt(Z))[..., None]
    r = np.sqrt(r2)
    px = 2.0 / size
    alpha = np.clip((1.0 - r) / px + 0.5, 0.0, 1.0)
    return np.dstack([rgb, alpha])


def wireframe(camera: Camera, n_lat: int = 5, n_lon: int = 12, samples: int = 96):
    """Meridians and parallels of the unit sphere as screen segments, split by depth.

    Returns (front, back): lists of (m, 2) polylines for LineCollection.set_segments."""
    t = np.linspace(0.0, 2.0 * np.pi, samples + 1)
    curves = []
    for lon in np.linspace(0.0, np.pi, n_lon // 2, endpoint=False):   # full great circles
        c = np.stack([np.cos(t) * np.cos(lon), np.cos(t) * np.sin(lon), np.sin(t)], axis=1)
        curves.append(c)
    for lat in np.linspace(-np.pi / 2, np.pi / 2, n_lat + 2)[1:-1]:
        c = np.stack([np.cos(lat) * np.cos(t), np.cos(lat) * np.sin(t), np.full_like(t, np.sin(lat))], axis=1)
        curves.append(c)
    front, back = [], []
    for pts in camera.project(np.stack(curves)):          # (samples+1, 3) per curve
        mid = (pts[:-1, 2] + pts[1:, 2]) / 2 >= 0          # segment i joins points i, i+1
        cuts = np.flatnonzero(np.diff(mid.astype(np.int8))) + 1
        start = 0
        for stop in list(cuts) + [mid.size]:               # runs of segments on one side
            (front if mid[start] else back).append(pts[start:stop + 1, :2])
            start = stop
    return front, back
