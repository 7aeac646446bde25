def test_min_new_tokens_holds_off_eos_and_stop_tokens():
    from schedkit.core.schedule_batch import Req, SamplingParams

    params = SamplingParams(max_new_tokens=10, stop_token_ids=(7,), min_new_tokens=3)
    req = Req(rid="r", origin_input_ids=[1], sampling_params=params)
    for token in (7, 2):
        req.output_ids.append(token)
        req.check_finished(eos_token_id=2)
        assert req.finished_reason is None
    req.output_ids.append(7)
    req.check_finished(eos_token_id=2)
    assert req.finished_reason is not None and req.finished_reason.matched == 7
    assert SamplingParams(min_new_tokens=-1).validation_error().startswith("min_new_tokens")
    too_many = SamplingParams(max_new_tokens=4, min_new_tokens=5).validation_error()
    assert too_many == "min_new_tokens must be in [0, max_new_tokens(4)], got 5"
    assert SamplingParams(max_new_tokens=4, min_new_tokens=4).validation_error() is None
