"""A failed run's error shows the author's own frames under the file they wrote; --verbose shows every frame."""

from __future__ import annotations

from engine.cli.tracebacks import readable

BUNDLE = "/root/.cache/gangflow/stores/b6115737e678a9ba/bundles/" + "4" * 64
ERROR = f"""TaskFailed: task 'divide' failed: ZeroDivisionError: integer division or modulo by zero
  File "/srv/venv/lib/python3.11/site-packages/temporalio/worker/_workflow_instance.py", line 2846, in _run
      await coro

    File "/srv/gangflow/workflows/shell.py", line 316, in run
      result = await defn.fn(**inputs)
               ^^^^^^^^^^^^^^^^^^^^^^^

    File "{BUNDLE}/pipelines/flow.py", line 12, in wf
      return await divide(x=x)
             ^^^^^^^^^^^^^^^^^
Activity task failed
ZeroDivisionError: integer division or modulo by zero
  File "/srv/gangflow/engine/executor/body.py", line 31, in call_body
      result = defn.fn(**inputs)

    File "/usr/lib/python3.11/concurrent/futures/thread.py", line 58, in run
      result = self.fn(*self.args, **self.kwargs)

    File "{BUNDLE}/pipelines/flow.py", line 4, in helper
      return 10 // x
             ~~~^^~~
    File "/home/me/shared/metrics.py", line 9, in score
      return 1 / n"""


def test_only_the_authors_frames_under_their_own_paths():
    assert readable(ERROR).splitlines() == [
        "TaskFailed: task 'divide' failed: ZeroDivisionError: integer division or modulo by zero",
        '  File "pipelines/flow.py", line 12, in wf',
        "    return await divide(x=x)",
        "ZeroDivisionError: integer division or modulo by zero",
        '  File "pipelines/flow.py", line 4, in helper',
        "    return 10 // x",
        '  File "/home/me/shared/metrics.py", line 9, in score',  # preloaded code outside a bundle: theirs too
        "    return 1 / n",
    ]


def test_verbose_keeps_everything_and_a_plain_message_passes_through():
    assert readable(ERROR, verbose=True) == ERROR
    assert readable("Unschedulable: needs 6 GPUs on 3 nodes") == "Unschedulable: needs 6 GPUs on 3 nodes"


def test_a_cause_that_repeats_another_without_frames_of_the_authors_is_said_once():
    said = "secret 'nope' of tenant 'default' is not set where this task runs (gangflow secret set default nope)"
    error = f"""TaskFailed: task 'f' failed: SecretNotFound: {said}
  File "{BUNDLE}/flow.py", line 9, in w
      return await f()
Activity task failed
SecretNotFound: {said}
  File "/srv/gangflow/engine/runtime/activities.py", line 101, in _execute
      raise _non_retryable(exc) from exc
SecretNotFoundError: {said}
  File "/srv/gangflow/engine/runtime/secrets.py", line 106, in resolve
      raise SecretNotFoundError("""
    assert readable(error).splitlines() == [
        f"TaskFailed: task 'f' failed: SecretNotFound: {said}",
        '  File "flow.py", line 9, in w',
        "    return await f()",
    ]
    # the same message twice, the second with the author's frame: said once, with it
    timed_out = "WaitTimedOut: no answer to input 'go' (bool) within 10 min"
    error = f"""{timed_out}
  File "/srv/venv/lib/python3.11/site-packages/temporalio/worker/_workflow_instance.py", line 2846, in _run
      await coro
{timed_out}
  File "{BUNDLE}/flow.py", line 10, in sweep
      t = await engine.wait_for_input("go", bool)"""
    assert readable(error).splitlines() == [
        timed_out,
        '  File "flow.py", line 10, in sweep',
        '    t = await engine.wait_for_input("go", bool)',
    ]
