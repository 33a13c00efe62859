"""Tests that assert the C-speed paths take an input need a sound regex engine.

CPython 3.11.0-3.11.4 mis-walk possessive repeats (gh-100061, gh-106052); there
core.pickle.fast.tokenize.ENGINE_SOUND is False and every walk declines to the exact
interpreters (whose reports the equality tests still compare).
"""

import pytest

from ckptguard.core.pickle.fast.tokenize import ENGINE_SOUND

needs_sound_re = pytest.mark.skipif(
    not ENGINE_SOUND, reason="this Python's re mis-walks possessive repeats (< 3.11.5): "
                             "the fast paths are off, the exact interpreters decide")
