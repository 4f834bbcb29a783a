"""Vehicles as the demo world's camera sees them: 3-D boxes (body, windows, lights, tyres) clipped at the near
plane, projected and filled far to near (painter's algorithm), with a vehicle-id buffer drawn alongside that
gives occlusion-aware 2-D boxes (:class:`PixelBox`): the one derivation behind the demo world's images and
labels and the detection truth of a bag's object boxes.

    projector = VehicleProjector(camera, mount)
    boxes = projector.boxes((x, y, yaw), vehicles)          # what the camera sees of them, left to right

Map and ego frames are REP-103; pixel (u, v) has u right, v down and integer values at pixel centres (OpenCV);
a pixel box ``[x0, y0, x1, y1]`` uses pixel edges, so the pixel in column j spans [j, j + 1).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Sequence

import cv2
import numpy as np

from .geometry import CameraMount, PinholeCamera, box_corners

# optical (x right, y down, z forward) from camera body (x forward, y left, z up)
OPTICAL_FROM_BODY = np.array([[0.0, -1.0, 0.0], [0.0, 0.0, -1.0], [1.0, 0.0, 0.0]])
FILL_SHIFT = 4                      # fillPoly sub-pixel bits
FILL_SCALE = float(1 << FILL_SHIFT)
# A vehicle is labelled (a ground-truth box) with at least this many visible pixels and a visible box at
# least this wide and high; the demo world's labels and eval-bag's truth both use these.
MIN_VISIBLE_PIXELS = 20
MIN_BOX_SIDE_PX = 4                 # about 60 m at 320 px across a 90 degree view


@dataclass(frozen=True)
class PixelBox:
    """A vehicle seen in the image."""
    id: int
    label: str
    box: tuple[float, float, float, float]          # visible extent, pixel edges [x0, y0, x1, y1]
    amodal_box: tuple[float, float, float, float]   # the whole projected box, clipped to the image
    visible_pixels: int
    visible_fraction: float                         # visible pixels / projected area
    distance_m: float                               # camera to the nearest point of the footprint


def _box_faces(length: float, width: float, height: float) -> dict[str, np.ndarray]:
    hl, hw, h = length / 2, width / 2, height
    return {
        "front": np.array([[hl, -hw, 0], [hl, hw, 0], [hl, hw, h], [hl, -hw, h]]),
        "rear": np.array([[-hl, hw, 0], [-hl, -hw, 0], [-hl, -hw, h], [-hl, hw, h]]),
        "left": np.array([[hl, hw, 0], [-hl, hw, 0], [-hl, hw, h], [hl, hw, h]]),
        "right": np.array([[-hl, -hw, 0], [hl, -hw, 0], [hl, -hw, h], [-hl, -hw, h]]),
        "top": np.array([[hl, hw, h], [-hl, hw, h], [-hl, -hw, h], [hl, -hw, h]]),
    }


def _face_visible(face: str, cam: np.ndarray, length: float, width: float, height: float) -> bool:
    """Back-face culling in the vehicle frame: the camera is on the outer side of the face."""
    return {"front": cam[0] > length / 2, "rear": cam[0] < -length / 2, "left": cam[1] > width / 2,
            "right": cam[1] < -width / 2, "top": cam[2] > height}[face]


_SHADE = {"front": 0.92, "rear": 0.85, "left": 0.72, "right": 0.66, "top": 1.08}
GLASS = (35, 45, 55)
TYRE = (20, 20, 22)


def _decorations(label: str, length: float, width: float, height: float, braking: bool):
    """(face, [4, 3] quad in the vehicle frame, RGB) drawn on top of the body."""
    hl, hw, h = length / 2, width / 2, height
    lit = (255, 40, 30) if braking else (120, 20, 20)
    light_z = (0.45 * h, 0.58 * h) if label == "car" else (0.6, 0.95)
    glass_z = (0.58 * h, 0.92 * h) if label == "car" else (0.55 * h, 0.88 * h)
    e = 0.01  # lift off the face so the quad is not coplanar with it
    out = []

    def across(x, y0, y1, z0, z1):
        return np.array([[x, y0, z0], [x, y1, z0], [x, y1, z1], [x, y0, z1]])

    def along(y, x0, x1, z0, z1):
        return np.array([[x0, y, z0], [x1, y, z0], [x1, y, z1], [x0, y, z1]])

    if label != "truck":
        out.append(("rear", across(-hl - e, -0.8 * hw, 0.8 * hw, *glass_z), GLASS))
    out.append(("front", across(hl + e, -0.85 * hw, 0.85 * hw, *glass_z), GLASS))
    for sign in (1.0, -1.0):
        out.append(("rear", across(-hl - e, sign * 0.62 * hw, sign * 0.95 * hw, *light_z), lit))
        out.append(("front", across(hl + e, sign * 0.62 * hw, sign * 0.92 * hw, 0.45, 0.6), (240, 230, 190)))
        side = "left" if sign > 0 else "right"
        y = sign * (hw + e)
        if label == "bus":
            out.append((side, along(y, -hl + 0.5, hl - 0.8, *glass_z), GLASS))
        elif label == "car":
            out.append((side, along(y, -0.55 * hl, 0.35 * hl, *glass_z), GLASS))
        else:
            out.append((side, along(y, hl - 1.9, hl - 0.2, *glass_z), GLASS))
        for x in (hl - 0.9, -hl + 0.9):
            out.append((side, along(y, x - 0.35, x + 0.35, 0.0, 0.35), TYRE))
    return out


@functools.lru_cache(maxsize=256)
def _vehicle_geometry(label: str, length: float, width: float, height: float, braking: bool):
    """(face, [4, 3] quad in the vehicle frame, RGB or None for the body colour, is_body) in draw
    order: the body faces, then windows, lights and tyres on top of them."""
    body = [(name, quad, None, True) for name, quad in _box_faces(length, width, height).items()]
    return tuple(body + [(face, quad, colour, False)
                         for face, quad, colour in _decorations(label, length, width, height, braking)])


def clip_near(poly: np.ndarray, near: float) -> np.ndarray:
    """Sutherland-Hodgman: the part of a polygon [n, 3] (optical frame) with z >= near."""
    out = []
    n = len(poly)
    for i in range(n):
        a, b = poly[i], poly[(i + 1) % n]
        a_in, b_in = a[2] >= near, b[2] >= near
        if a_in:
            out.append(a)
        if a_in != b_in:
            t = (near - a[2]) / (b[2] - a[2])
            out.append(a + t * (b - a))
    return np.array(out) if out else np.zeros((0, 3))


@dataclass(frozen=True)
class VehicleBox:
    """A vehicle as a box standing on the ground (map frame): what :meth:`VehicleProjector.draw` draws (the demo
    world's vehicles, a bag's objects)."""

    id: int
    label: str
    x: float            # box centre
    y: float
    yaw: float
    length_m: float
    width_m: float
    height_m: float
    colour: tuple[int, int, int] = (0, 0, 0)   # (a bag's objects: only the id buffer matters)
    braking: bool = False
    lane: str = ""      # the demo world's lane name (World.lanes), "" for the ego and a bag's objects
    speed: float = 0.0  # m/s along yaw

    def corners(self) -> np.ndarray:
        """[4, 2] ground corners, counter-clockwise from front left."""
        return box_corners(self.x, self.y, self.yaw, self.length_m, self.width_m)


class VehicleProjector:
    """A camera on the ego (intrinsics ``camera``, pose ``mount`` in the ego frame) that draws vehicles and
    reports the visible ones: at least ``min_visible_pixels`` visible pixels and a visible box no narrower
    or lower than ``min_box_side_px`` (otherwise not annotated)."""

    NEAR_M = 0.2

    def __init__(self, camera: PinholeCamera, mount: CameraMount, min_visible_pixels: int = MIN_VISIBLE_PIXELS,
                 min_box_side_px: int = MIN_BOX_SIDE_PX):
        self.camera, self.mount = camera, mount
        self.min_visible_pixels, self.min_box_side_px = min_visible_pixels, min_box_side_px
        self.optical_from_ego = OPTICAL_FROM_BODY @ mount.rotation().T      # [3, 3]
        self.camera_in_ego = np.array([mount.x_m, mount.y_m, mount.z_m])
        # image borders as slopes x / z in the optical frame (a pixel of margin)
        self._right_slope = (camera.width + 1 - camera.cx) / camera.fx
        self._left_slope = (camera.cx + 1) / camera.fx

    def boxes(self, pose, vehicles: Sequence[VehicleBox]) -> list[PixelBox]:
        """The visible ``vehicles`` seen from ``pose`` as :meth:`draw` reports them, drawn into scratch buffers."""
        img = np.zeros((self.camera.height, self.camera.width, 3), np.uint8)
        ids = np.full((self.camera.height, self.camera.width), -1, np.int32)
        return self.draw(img, ids, pose, vehicles)

    def project(self, points_optical: np.ndarray) -> np.ndarray:
        """[N, 3] optical points (z > 0) -> [N, 2] pixels."""
        cam = self.camera
        z = points_optical[:, 2]
        return np.stack([cam.fx * points_optical[:, 0] / z + cam.cx, cam.fy * points_optical[:, 1] / z + cam.cy], 1)

    def draw(self, img: np.ndarray, ids: np.ndarray, pose, vehicles: Sequence[VehicleBox]) -> list[PixelBox]:
        """Paint ``vehicles`` into ``img`` [H, W, 3] and their ids into ``ids`` [H, W] seen from the ego
        ``pose`` (x, y, yaw of the rear axle, map frame); the visible ones as boxes, left to right."""
        x, y, yaw = pose
        c, s = math.cos(yaw), math.sin(yaw)
        cam = self.camera
        ego_from_map = np.array([[c, s, 0.0], [-s, c, 0.0], [0.0, 0.0, 1.0]])
        camera_map = np.array([x, y, 0.0]) + ego_from_map.T @ self.camera_in_ego
        nearest = [(float(np.min(np.hypot(*(v.corners() - camera_map[:2]).T))), v) for v in vehicles]
        # far first: nearer vehicles paint over farther ones
        order = sorted([(d, v) for d, v in nearest if d < 150.0], key=lambda item: -item[0])
        drawn = []
        for distance, v in order:
            cv_, sv = math.cos(v.yaw), math.sin(v.yaw)
            map_from_vehicle = np.array([[cv_, -sv, 0.0], [sv, cv_, 0.0], [0.0, 0.0, 1.0]])
            origin = np.array([v.x, v.y, 0.0])
            # vehicle frame -> map -> ego -> optical, as one affine map
            rot = self.optical_from_ego @ ego_from_map @ map_from_vehicle
            trans = self.optical_from_ego @ (ego_from_map @ (origin - np.array([x, y, 0.0])) - self.camera_in_ego)
            # cull on the bounding sphere before building faces: behind the camera or beside the view
            radius = 0.5 * math.sqrt(v.length_m**2 + v.width_m**2 + v.height_m**2)
            centre = trans + rot[:, 2] * (0.5 * v.height_m)
            if centre[2] < self.NEAR_M - radius or centre[0] - radius > max(centre[2], 0.0) * self._right_slope \
                    or centre[0] + radius < -max(centre[2], 0.0) * self._left_slope:
                continue
            cam_local = map_from_vehicle.T @ (camera_map - origin)
            geometry = _vehicle_geometry(v.label, v.length_m, v.width_m, v.height_m, v.braking)
            visible = [(f, q, col, body) for f, q, col, body in geometry
                       if _face_visible(f, cam_local, v.length_m, v.width_m, v.height_m)]
            if not visible:
                continue
            quads = np.stack([q for _, q, _, _ in visible]) @ rot.T + trans       # [M, 4, 3] optical
            if quads[..., 2].max() < self.NEAR_M:
                continue
            if quads[..., 2].min() >= self.NEAR_M:                                # fast path: all in front
                uv_all = self.project(quads.reshape(-1, 3)).reshape(-1, 4, 2)
                pts_all = np.round(uv_all * FILL_SCALE).astype(np.int32)
                polys = list(zip(uv_all, pts_all))
            else:
                polys = []
                for q in quads:
                    clipped = clip_near(q, self.NEAR_M)
                    uv = self.project(clipped) if len(clipped) >= 3 else None
                    polys.append(None if uv is None else (uv, np.round(uv * FILL_SCALE).astype(np.int32)))
            shades = {face: tuple(min(255, int(c_ * s_)) for c_ in v.colour) for face, s_ in _SHADE.items()}
            body_uv = []
            for (face, _, colour, body), poly in zip(visible, polys):
                if poly is None:
                    continue
                uv, pts = poly
                cv2.fillPoly(img, [pts], shades[face] if body else colour, cv2.LINE_8, FILL_SHIFT)
                if body:
                    cv2.fillPoly(ids, [pts], int(v.id), cv2.LINE_8, FILL_SHIFT)
                    body_uv.append(uv)
            if not body_uv:
                continue
            hull = cv2.convexHull(np.concatenate(body_uv).astype(np.float32))
            area = float(cv2.contourArea(hull))
            lo, hi = hull.reshape(-1, 2).min(0), hull.reshape(-1, 2).max(0)
            amodal = (float(np.clip(lo[0] + 0.5, 0, cam.width)), float(np.clip(lo[1] + 0.5, 0, cam.height)),
                      float(np.clip(hi[0] + 0.5, 0, cam.width)), float(np.clip(hi[1] + 0.5, 0, cam.height)))
            if amodal[2] <= amodal[0] or amodal[3] <= amodal[1]:
                continue
            drawn.append((v, distance, amodal, area))

        boxes = []
        for v, distance, amodal, area in drawn:
            x0, y0 = int(math.floor(amodal[0])), int(math.floor(amodal[1]))
            x1, y1 = int(math.ceil(amodal[2])), int(math.ceil(amodal[3]))
            rows, cols = np.nonzero(ids[y0:y1 + 1, x0:x1 + 1] == v.id)
            if len(rows) < self.min_visible_pixels:
                continue
            box = (float(x0 + cols.min()), float(y0 + rows.min()), float(x0 + cols.max() + 1), float(y0 + rows.max() + 1))
            if min(box[2] - box[0], box[3] - box[1]) < self.min_box_side_px:
                continue
            boxes.append(PixelBox(v.id, v.label, box, amodal, int(len(rows)),
                                  float(min(1.0, len(rows) / max(area, 1.0))), distance))
        boxes.sort(key=lambda b: (b.box[0], b.box[1], b.id))
        return boxes
