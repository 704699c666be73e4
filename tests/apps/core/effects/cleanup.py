from runtime import ThreadState, define_effect

CALLS: list[str] = []


def cleanup(state: ThreadState) -> None:
    # A sync effect without arguments: runs in a worker thread.
    with open(state.runtime.settings.data_dir / "cleanup.log", "a") as f:
        f.write(state.thread_id + "\n")


effect = define_effect("Cleans up (sync, no args).", cleanup)
