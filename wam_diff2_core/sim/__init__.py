"""The demo world: synthetic driving scenes with real geometry, for data, bags and closed loop.

ROS-free (the bag export uses the pure-Python ``rosbags`` library). Deterministic by seed.

    from wam_diff2_core.sim import EpisodeSettings, simulate_episode
    episode = simulate_episode(seed=0, index=3, settings=EpisodeSettings(frames=50))
    for frame in episode.frames():
        frame.rgb                      # [180, 320, 3] uint8, the front camera
        frame.truth.waypoints          # [8, 2] ego frame, +0.5 ... +4.0 s of the expert's future
        frame.truth.command            # left | straight | right

Closed loop (a controller instead of the expert):

    world = World.generate(np.random.default_rng([seed, i]), WorldSettings(), duration_s=60.0)
    renderer = Renderer(world.road, CameraSettings(), Palette())
    rgb = renderer.render((world.ego.x, world.ego.y, world.ego.yaw), world.vehicle_boxes()).rgb
    world.step(VehicleControl(throttle=0.4, steer=0.0, brake=0.0))
    world.status()                     # route completion, lane offset, collisions

Modules, in pipeline order: ``road`` (geometry), ``vehicles`` (bicycle model, IDM, traffic),
``expert`` (pure pursuit + speed control), ``world`` (stepping), ``camera`` (rendering),
``truth`` (command rule, questions), ``episode`` (simulate + ground truth), ``bag`` and
``export`` (files). The closed loop: ``route_runs`` (one route, its world and its score),
``route_planners`` (the oracle, the policy), ``direct_loop`` (the loop without ROS, the
controller's gains for the demo car), ``expert_labels`` (DAgger's samples), ``route_report``
(summaries and plots over routes). See README.md in this folder.
"""
from .camera import CameraSettings, Palette, PixelBox, Renderer, Rendering
from .episode import Episode, EpisodeSettings, RecoverySettings, Frame, FrameTruth, make_world, simulate_episode
from .expert import ExpertDriver, ExpertSettings, Leader
from .road import Crossing, Curve, Path2D, RoadMap, RoadSettings, RouteSettings, Straight, build_road, generate_road
from .truth import CommandSettings, route_command
from .vehicles import Actuation, BicycleParams, EgoState, KinematicBicycle, VehicleControl
from .world import EgoStatus, VehicleBox, World, WorldSettings

__all__ = [
    "Actuation", "BicycleParams", "CameraSettings", "CommandSettings", "Crossing", "Curve", "EgoState", "EgoStatus",
    "Episode", "EpisodeSettings", "RecoverySettings", "ExpertDriver", "ExpertSettings", "Frame", "FrameTruth", "KinematicBicycle",
    "Leader", "Palette", "Path2D", "PixelBox", "Renderer", "Rendering", "RoadMap", "RoadSettings", "RouteSettings",
    "Straight", "VehicleBox", "VehicleControl", "World", "WorldSettings", "build_road", "generate_road", "make_world",
    "route_command", "simulate_episode",
]
