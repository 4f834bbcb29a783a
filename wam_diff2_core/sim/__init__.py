"""The demo world: synthetic driving scenes with real geometry, for data, bags and closed loop; ROS-free and
deterministic by seed. Its modules and rules: README.md in this folder.

    from wam_diff2_core.sim import EpisodeSettings, simulate_episode
    episode = simulate_episode(seed=0, index=3, settings=EpisodeSettings(frames=50))
    for frame in episode.frames():
        frame.rgb, frame.truth.waypoints, frame.truth.command     # the camera, the expert's future, the command
"""
# ruff: noqa: F401  (the imports are the package's names)
from .camera import CameraSettings, Palette, PixelBox, Renderer, Rendering
from .episode import Episode, EpisodeSettings, RecoverySettings, Frame, FrameTruth, make_world, simulate_episode
from .expert import ExpertDriver, ExpertSettings, Leader
from .road import Crossing, Curve, Path2D, RoadMap, RoadSettings, RouteSettings, Straight, build_road, generate_road
from .truth import CommandSettings, route_command
from .vehicles import Actuation, BicycleParams, EgoState, KinematicBicycle, VehicleControl
from .world import EgoStatus, VehicleBox, World, WorldSettings
