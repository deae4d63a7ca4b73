"""PEP 517 backend: setuptools, after regenerating the protobuf modules from protos/*.proto."""

from __future__ import annotations

from typing import Any

from generate import generate  # protos/ is this backend's path (pyproject backend-path)
from setuptools import build_meta as _setuptools
from setuptools.build_meta import *


def build_wheel(
    wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None
) -> str:
    generate()
    return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(
    wheel_directory: str, config_settings: Any = None, metadata_directory: Any = None
) -> str:
    generate()
    return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory: str, config_settings: Any = None) -> str:
    generate()
    return _setuptools.build_sdist(sdist_directory, config_settings)
