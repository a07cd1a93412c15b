import pytest

from kiln.options import Options


def test_defaults():
    o = Options.from_env({})
    assert o == Options()
    assert o.opt_level == 2 and o.memory_plan and not o.fast_math


def test_from_mapping_takes_fields_by_name():
    o = Options.from_mapping({"opt_level": 3, "debug": True})
    assert o.opt_level == 3 and o.debug


def test_unknown_option_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown kiln option.*opt_levle.*known: .*opt_level"):
        Options.from_mapping({"opt_levle": 3})


@pytest.mark.parametrize("bad", [-1, 4, "2"])
def test_bad_opt_level(bad):
    with pytest.raises(ValueError, match="opt_level"):
        Options(opt_level=bad)


def test_bool_fields_are_checked():
    with pytest.raises(TypeError, match="debug"):
        Options(debug="yes")


def test_environment_is_read_only_here():
    o = Options.from_env({"KILN_OPT_LEVEL": "0", "KILN_DEBUG": "1", "KILN_STRICT": "false"})
    assert o.opt_level == 0 and o.debug and not o.strict
    assert not o.fast_math and Options.from_env({"KILN_FAST_MATH": "1"}).fast_math
