"""The front camera of the demo world: a pinhole camera that renders what the geometry says (how:
sim/README.md, "The camera"). The ground is looked up in a bird's-eye texture of the roads from points fixed
in the ego frame (the camera is rigid on the ego); vehicles are drawn over it by
``vehicle_projection.VehicleProjector``, with a vehicle-id buffer that gives occlusion-aware 2-D boxes.

    >>> import numpy as np
    >>> from .road import Straight, RoadSettings, build_road
    >>> road = build_road([Straight(120.0)], RoadSettings())
    >>> renderer = Renderer(road, CameraSettings(width=160, height=90), Palette())
    >>> frame = renderer.render(road.lane.pose_at(5.0), [])
    >>> frame.rgb.shape, frame.rgb.dtype
    ((90, 160, 3), dtype('uint8'))
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Sequence

import cv2
import numpy as np

from ..camera_rig import DEMO_CAMERA_FROM_AXLE_M, PRESETS
from ..geometry import CameraMount, PinholeCamera
from ..vehicle_projection import (FILL_SCALE, FILL_SHIFT, MIN_BOX_SIDE_PX, MIN_VISIBLE_PIXELS, PixelBox, VehicleBox,
                                  VehicleProjector)
from .road import RoadMap

DASH_ON_M, DASH_PERIOD_M = 3.0, 9.0
MARKING_WIDTH_M = 0.15
STOP_LINE_WIDTH_M = 0.4


_RIG = PRESETS["demo"]


@dataclass(frozen=True)
class CameraSettings:
    # the demo rig (camera_rig.PRESETS["demo"], what the demo models' camera block says)
    width: int = _RIG.width
    height: int = _RIG.height
    horizontal_fov_deg: float = _RIG.fov_deg
    # rear axle -> camera: near the top of the windscreen, looking straight ahead
    mount: CameraMount = field(default_factory=lambda: CameraMount(x_m=DEMO_CAMERA_FROM_AXLE_M, z_m=_RIG.z_m))
    max_range_m: float = 400.0          # ground beyond this is drawn as horizon haze
    haze_distance_m: float = 300.0      # ground colour fades to haze as 1 - exp(-d / this)
    texture_resolution_m: float = 0.1   # finest bird's-eye texel
    texture_max_pixels: int = 16_000_000
    min_visible_pixels: int = MIN_VISIBLE_PIXELS    # fewer visible pixels, or a visible box narrower or
    min_box_side_px: int = MIN_BOX_SIDE_PX          # lower than this: the vehicle is not annotated

    def camera(self) -> PinholeCamera:
        return PinholeCamera.from_horizontal_fov(self.width, self.height, self.horizontal_fov_deg)


@dataclass(frozen=True)
class Palette:
    """Colours of one episode (RGB)."""
    sky_top: tuple[int, int, int] = (90, 140, 210)
    sky_horizon: tuple[int, int, int] = (190, 210, 230)
    haze: tuple[int, int, int] = (185, 195, 205)
    grass: tuple[int, int, int] = (70, 120, 50)
    asphalt: tuple[int, int, int] = (92, 92, 96)
    marking: tuple[int, int, int] = (235, 235, 230)
    centre_marking: tuple[int, int, int] = (235, 235, 230)

    @classmethod
    def random(cls, rng: np.random.Generator) -> "Palette":
        """Varied lighting and materials; asphalt stays neutral grey and grass clearly green."""
        light = float(rng.uniform(0.8, 1.15))

        def scaled(rgb, f=light):
            return tuple(int(np.clip(c * f, 0, 255)) for c in rgb)

        grey = float(rng.uniform(75, 115))
        green = (float(rng.uniform(50, 95)), float(rng.uniform(105, 150)), float(rng.uniform(35, 70)))
        yellow_centre = rng.random() < 0.3
        return cls(sky_top=scaled((rng.uniform(70, 120), rng.uniform(120, 160), rng.uniform(190, 235))),
                   sky_horizon=scaled((rng.uniform(175, 210), rng.uniform(195, 220), rng.uniform(215, 240))),
                   haze=scaled((185, 195, 205)), grass=scaled(green), asphalt=scaled((grey, grey, grey + 3)),
                   marking=scaled((235, 235, 230)),
                   centre_marking=scaled((230, 190, 40) if yellow_centre else (235, 235, 230)))


@dataclass
class Rendering:
    rgb: np.ndarray          # [H, W, 3] uint8 RGB
    vehicle_ids: np.ndarray  # [H, W] int32, the vehicle drawn at each pixel, -1 for none
    boxes: list[PixelBox]    # visible vehicles, left to right


class GroundTexture:
    """The episode's roads from above, with mip levels; texel (r, c) of level 0 centres on
    map point (x_min + (c + .5) res, y_max - (r + .5) res)."""

    def __init__(self, road: RoadMap, palette: Palette, resolution_m: float, max_pixels: int,
                 rng: np.random.Generator | None = None):
        margin = road.settings.lane_width_m + road.settings.shoulder_m + 5.0
        x0, y0, x1, y1 = road.bounds(margin)
        area = (x1 - x0) * (y1 - y0)
        self.resolution_m = max(resolution_m, math.sqrt(area / max_pixels))
        self.x_min, self.y_max = x0, y1
        width = int(math.ceil((x1 - x0) / self.resolution_m))
        height = int(math.ceil((y1 - y0) / self.resolution_m))
        self.levels = [self._draw(road, palette, width, height, rng)]
        while min(self.levels[-1].shape[:2]) > 8 and len(self.levels) < 6:
            h, w = self.levels[-1].shape[:2]
            self.levels.append(cv2.resize(self.levels[-1], (w // 2, h // 2), interpolation=cv2.INTER_AREA))
        # metres per texel of each level, per axis (halving rounds sizes down)
        self.level_res = [(width * self.resolution_m / lvl.shape[1], height * self.resolution_m / lvl.shape[0])
                          for lvl in self.levels]

    def to_pixels(self, xy: np.ndarray) -> np.ndarray:
        """[N, 2] map points -> [N, 2] level-0 texture coordinates (col, row), fillPoly-scaled."""
        col = (xy[:, 0] - self.x_min) / self.resolution_m - 0.5
        row = (self.y_max - xy[:, 1]) / self.resolution_m - 0.5
        return np.round(np.stack([col, row], 1) * FILL_SCALE).astype(np.int32)

    def _draw(self, road: RoadMap, palette: Palette, width: int, height: int,
              rng: np.random.Generator | None) -> np.ndarray:
        rs = road.settings
        res = self.resolution_m
        # grass with gentle low-frequency variation (deterministic: drawn from the episode's rng)
        noise_rng = rng if rng is not None else np.random.default_rng(0)
        small = noise_rng.normal(0.0, 1.0, (max(2, height // 24), max(2, width // 24), 1)).astype(np.float32)
        grass = np.clip(np.asarray(palette.grass, np.float32) * (1.0 + 0.07 * small), 0, 255).astype(np.uint8)
        img = cv2.resize(grass, (width, height), interpolation=cv2.INTER_LINEAR)

        half = rs.lane_width_m + rs.shoulder_m
        roads = [road.centreline] + list(road.stubs)
        for path in roads:
            outline = np.concatenate([path.offset(half).points, path.offset(-half).points[::-1]])
            cv2.fillPoly(img, [self.to_pixels(outline)], palette.asphalt, cv2.LINE_AA, FILL_SHIFT)
        for crossing in road.crossings:
            cv2.fillPoly(img, [self.to_pixels(crossing.corners())], palette.asphalt, cv2.LINE_AA, FILL_SHIFT)

        thick = max(1, int(round(MARKING_WIDTH_M / res)))
        masks = [~road.in_crossing] + [np.ones(len(s.points), bool) for s in road.stubs]
        for path, keep in zip(roads, masks):
            for side in (rs.lane_width_m, -rs.lane_width_m):     # solid edge lines
                edge = path.offset(side).points
                for run in _runs(keep):
                    self._line(img, edge[run], palette.marking, thick)
            dashes = keep & ((path.s % DASH_PERIOD_M) < DASH_ON_M)   # dashed centre line
            for run in _runs(dashes):
                self._line(img, path.points[run], palette.centre_marking, thick)
        stop = max(1, int(round(STOP_LINE_WIDTH_M / res)))
        for crossing in road.crossings:
            a = crossing.half_size_m
            arms = [crossing.heading_in + math.pi, crossing.heading_in, crossing.heading_in + math.pi / 2,
                    crossing.heading_in - math.pi / 2]
            for arm in arms:    # a stop line across the lane that drives into the box on every arm
                out = np.array([math.cos(arm), math.sin(arm)])
                left = np.array([-out[1], out[0]])
                start = crossing.centre + out * (a + STOP_LINE_WIDTH_M / 2)
                line = np.stack([start + left * 0.2, start + left * (rs.lane_width_m - 0.2)])
                self._line(img, line, palette.marking, stop)
        return img

    def _line(self, img: np.ndarray, points: np.ndarray, colour, thickness: int) -> None:
        if len(points) >= 2:
            cv2.polylines(img, [self.to_pixels(points)], False, colour, thickness, cv2.LINE_AA, FILL_SHIFT)


def _runs(mask: np.ndarray) -> list[slice]:
    """Slices of consecutive True values."""
    padded = np.concatenate([[False], mask, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [slice(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


class Renderer:
    """Renders one episode's world from the ego's front camera."""

    def __init__(self, road: RoadMap, settings: CameraSettings, palette: Palette,
                 rng: np.random.Generator | None = None):
        self.settings, self.palette = settings, palette
        self.camera = settings.camera()
        self.mount = settings.mount
        self.texture = GroundTexture(road, palette, settings.texture_resolution_m, settings.texture_max_pixels, rng)
        self.projector = VehicleProjector(self.camera, self.mount, settings.min_visible_pixels,
                                          settings.min_box_side_px)
        self._prepare_pixels()

    def _prepare_pixels(self) -> None:
        cam, st = self.camera, self.settings
        h, w = cam.height, cam.width
        u, v = np.meshgrid(np.arange(w, dtype=np.float64), np.arange(h, dtype=np.float64))
        rays_opt = np.stack([(u - cam.cx) / cam.fx, (v - cam.cy) / cam.fy, np.ones_like(u)], -1)   # [H, W, 3]
        rays = rays_opt @ self.projector.optical_from_ego          # ego-frame directions (row vector times M = M^T d)
        norm = np.linalg.norm(rays, axis=-1)
        elevation = np.arcsin(np.clip(rays[..., 2] / norm, -1, 1))
        # sky: a gradient over elevation
        t = np.clip(elevation / 0.45, 0.0, 1.0)[..., None]
        sky = (1 - t) * np.asarray(self.palette.sky_horizon, np.float32) + t * np.asarray(self.palette.sky_top, np.float32)
        below = rays[..., 2] < -1e-9
        depth = np.where(below, -self.projector.camera_in_ego[2] / np.where(below, rays[..., 2], -1.0), 1e9)
        ground = self.projector.camera_in_ego[:2] + depth[..., None] * rays[..., :2]     # [H, W, 2] ego frame
        distance = depth * norm
        is_ground = below & (distance <= st.max_range_m)
        sky[below & ~is_ground] = np.asarray(self.palette.haze, np.float32)
        self.background = np.clip(sky, 0, 255).astype(np.uint8)

        # texel footprint of each ground pixel: how far the ground point moves to the next row/column
        far = np.where(is_ground[..., None], ground, np.nan)
        dv = np.full((h, w), np.inf)
        du = np.full((h, w), np.inf)
        dv[:-1] = np.hypot(*(far[1:] - far[:-1]).transpose(2, 0, 1))
        du[:, :-1] = np.hypot(*(far[:, 1:] - far[:, :-1]).transpose(2, 0, 1))
        du[:, -1] = du[:, -2]
        dv[-1] = dv[-2]
        # the geometric mean of the two: the larger one (along the view) alone would blur the lane
        # edges sideways over several metres near the horizon
        footprint = np.fmin(np.nan_to_num(np.sqrt(dv * du), nan=np.inf), 1e6)
        # One mip level per image row (the footprint of a level camera's ground pixel depends on
        # the row), so each level is a band of whole rows that one remap writes in place.
        res0 = self.texture.resolution_m
        row_footprint = np.array([np.median(footprint[r][is_ground[r]]) if is_ground[r].any() else np.inf
                                  for r in range(h)])
        row_level = np.clip(np.floor(np.log2(np.maximum(row_footprint / res0, 1.0))), 0,
                            len(self.texture.levels) - 1).astype(int)
        haze_w = np.where(is_ground, 1.0 - np.exp(-np.where(is_ground, distance, 0.0) / st.haze_distance_m), 1.0)
        haze = np.asarray(self.palette.haze, np.float32)
        self._bands = []
        # runs of consecutive ground rows at one mip level (the key is constant along such a run)
        for _, run in itertools.groupby(enumerate(np.flatnonzero(is_ground.any(axis=1))),
                                        key=lambda item: (row_level[item[1]], item[1] - item[0])):
            rows = [r for _, r in run]
            r0, band = int(rows[0]), slice(int(rows[0]), int(rows[-1]) + 1)
            keep = is_ground[band]
            weight = haze_w[band].astype(np.float32)[..., None]                   # [rows, W, 1]
            self._bands.append(dict(
                rows=band, level=int(row_level[r0]),
                ex=np.where(keep, ground[band, :, 0], 0.0).astype(np.float32),   # ego-frame ground points
                ey=np.where(keep, ground[band, :, 1], 0.0).astype(np.float32),
                scale=1.0 - weight, offset=weight * haze,                          # colour = tex * scale + offset
                sky=None if keep.all() else ~keep))                                # not ground: keep the background

    def render(self, ego_pose: Sequence[float], vehicles: Sequence[VehicleBox]) -> Rendering:
        """Render from the ego pose (x, y, yaw of the rear axle, map frame) with these vehicles."""
        x, y, yaw = (float(v) for v in ego_pose)
        img = self.background.copy()
        c, s = math.cos(yaw), math.sin(yaw)
        tex = self.texture
        border = tuple(int(v) for v in self.palette.grass)
        for band in self._bands:
            rx, ry = tex.level_res[band["level"]]
            # texture coordinates of the map point (x, y) + R(yaw) (ex, ey), texel centres at integers
            map_x = band["ex"] * np.float32(c / rx) + band["ey"] * np.float32(-s / rx) \
                + np.float32((x - tex.x_min) / rx - 0.5)
            map_y = band["ex"] * np.float32(-s / ry) + band["ey"] * np.float32(-c / ry) \
                + np.float32((tex.y_max - y) / ry - 0.5)
            sampled = cv2.remap(tex.levels[band["level"]], map_x, map_y, cv2.INTER_LINEAR,
                                borderMode=cv2.BORDER_CONSTANT, borderValue=border)
            colour = (sampled * band["scale"] + band["offset"]).astype(np.uint8)
            if band["sky"] is not None:
                np.copyto(colour, img[band["rows"]], where=band["sky"][..., None])
            img[band["rows"]] = colour
        ids = np.full(img.shape[:2], -1, np.int32)
        boxes = self.projector.draw(img, ids, (x, y, yaw), vehicles)
        return Rendering(img, ids, boxes)

