from tests.examples.example_suite import run_example_tests, schedkit_run

pytest_plugins = ["pytester"]


def test_the_examples_own_tests_pass(pytester):
    result = run_example_tests(pytester, "swap_for_mock")
    result.assert_outcomes(passed=3)


def test_schedkit_run_with_the_scripted_runner_overlay():
    summary = schedkit_run(
        "swap_for_mock",
        "wiring.yaml",
        "-o",
        "examples/swap_for_mock/scripted.yaml",
        "--workload",
        "examples/swap_for_mock/requests.jsonl",
    )
    # r1's script is 5 6 7 2 and r2's 9 2, with 2 the EOS token: 6 tokens in all, although
    # both requests allow 32; the simulated runner would have produced 64.
    assert (summary["requests_done"], summary["output_tokens"]) == (2, 6)
    # four steps of 10 ms on the scripted runner's clock: one prefill, three decodes
    assert round(summary["simulated_s"], 6) == 0.04
