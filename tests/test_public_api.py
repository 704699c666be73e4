import runtime


def test_all_is_sorted_and_matches_the_exports() -> None:
    public = {
        name for name, value in vars(runtime).items()
        if (not name.startswith("_") and getattr(value, "__module__", "").startswith("runtime"))
        or name == "MAX_ATTEMPTS"
    }
    assert runtime.__all__ == sorted(runtime.__all__, key=lambda n: (not n.isupper(), n))
    assert set(runtime.__all__) == public
