"""A tab's model field becomes a `ModelSpec` in one place (`ModelSpec.from_field`): stripped, empty means bundled."""

import pytest

from kvlab.models.loading import ModelSpec

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, source", [(None, "bundled"), ("", "bundled"), ("  ", "bundled"),
                                          (" bundled:gemma-3-270m ", "bundled:gemma-3-270m")])
def test_a_field_is_stripped_and_empty_means_the_bundled_model(text, source):
    assert ModelSpec.from_field(text, "float32", "cpu") == ModelSpec(source, "float32", "cpu")


def test_a_bad_dtype_is_refused_as_the_constructor_refuses_it():
    with pytest.raises(ValueError, match="dtype must be one of"):
        ModelSpec.from_field("bundled", "int3")
