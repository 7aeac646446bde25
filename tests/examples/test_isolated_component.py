from tests.examples.example_suite import run_example_tests

pytest_plugins = ["pytester"]


def test_the_examples_own_tests_pass(pytester):
    result = run_example_tests(pytester, "isolated_component")
    result.assert_outcomes(passed=3)
