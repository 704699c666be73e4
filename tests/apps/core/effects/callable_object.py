"""An effect defined with an object whose __call__ is async."""

from runtime import ThreadState, define_effect


class Handler:
    async def __call__(self, state: ThreadState) -> None:
        (state.runtime.settings.data_dir / "callable_object.ran").write_text("yes")


effect = define_effect("An async callable object.", Handler())
