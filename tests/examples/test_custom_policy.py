from tests.examples.example_suite import run_example_tests, schedkit_run

pytest_plugins = ["pytester"]


def test_the_examples_own_tests_pass(pytester):
    result = run_example_tests(pytester, "custom_policy")
    result.assert_outcomes(passed=6)


def test_schedkit_run_with_the_policy_overlay():
    summary = schedkit_run(
        "custom_policy",
        "wiring.yaml",
        "-o",
        "examples/custom_policy/busy.yaml",
        "-o",
        "examples/custom_policy/policy.yaml",
        "--num-requests",
        "100",
    )
    assert (summary["requests_done"], summary["requests_failed"]) == (100, 0)
    assert summary["peak_running_requests"] == 16  # busy.yaml's limit
