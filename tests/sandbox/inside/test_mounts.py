"""The zygote's mount helpers that run without privileges: which hidden-file paths it takes."""

from __future__ import annotations

import pytest

from posttrain.sandbox.inside import mounts


@pytest.mark.parametrize("path", ["tests/test_a.py", "conftest.py", "a/b/c/setup.cfg"])
def test_a_plain_relative_path_is_taken(path):
    assert mounts._hidden_path(path) == path


@pytest.mark.parametrize("path", ["/etc/passwd", "../up/x.py", "tests/../../x.py", "tests//a.py", "tests/./a.py",
                                  "", "tests/", "a\0b.py", 3])
def test_a_path_that_could_leave_the_tree_is_refused(path):
    with pytest.raises(ValueError, match="relative and plain"):
        mounts._hidden_path(path)
