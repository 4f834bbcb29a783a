"""The test suite, a package tree mirroring the code (test/core/ <- wam_diff2_core, test/ros/ <- wam_diff2_ros,
test/scripts/ <- scripts, test/project/ the repository as a whole). Being packages, the test modules import
under their full names (``test.core.decoding.test_decoder``) and pytest puts only the checkout's root on
sys.path; shared helpers are imported from ``test.support``, shared fixtures come from the conftest.py files.
This package shadows the standard library's regression-test package ``test``, which nothing here uses."""
