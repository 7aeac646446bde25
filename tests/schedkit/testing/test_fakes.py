import attrs
import pytest

from schedkit.components.cache.radix_cache import RadixCache
from schedkit.components.io.kv_events_publisher import KvEventsPublisher
from schedkit.components.io.output_streamer import OutputStreamer
from schedkit.components.scheduler.batch_result_processor import BatchResultProcessor
from schedkit.core.component import component
from schedkit.core.schedule_batch import (
    ForwardMode,
    GenerationBatchResult,
    Req,
    SamplingParams,
    ScheduleBatch,
)
from schedkit.testing import Call, fake


@component("testing_sample_gauge", frozen=True)
class Gauge:
    """A frozen component whose constructor refuses to run, so a fake must not call it."""

    capacity: int
    label: str = "gauge"
    history: list[int] = attrs.Factory(list)
    _secret: int = attrs.field(init=False, default=7)

    def __attrs_post_init__(self) -> None:
        raise AssertionError("fake() instantiated the real class")

    def read(self, channel: int, *, scale: float = 1.0) -> float:
        return channel * scale

    @property
    def full(self) -> bool:
        return False

    @staticmethod
    def unit() -> str:
        return "V"

    @classmethod
    def named(cls, label: str) -> "Gauge":
        return cls(capacity=1, label=label)


def test_a_frozen_slotted_component_is_faked_without_running_its_constructor():
    assert attrs.has(Gauge) and "__slots__" in Gauge.__dict__
    gauge = fake(Gauge, capacity=3)
    assert isinstance(gauge, Gauge)
    assert (gauge.capacity, gauge.label, gauge.history, gauge._secret) == (3, "gauge", [], 7)


def test_calling_a_method_the_component_lacks_names_the_class_and_its_methods():
    gauge = fake(Gauge, capacity=3)
    with pytest.raises(AttributeError) as info:
        gauge.reset()
    message = str(info.value)
    assert "Gauge has no attribute 'reset'" in message
    assert "methods: named, read, unit" in message
    assert gauge.calls == []


@pytest.mark.parametrize(
    ("args", "kwargs", "problem"),
    [
        ((), {}, "missing a required argument: 'channel'"),
        ((1, 2), {}, "too many positional arguments"),
        ((1,), {"scal": 2.0}, "got an unexpected keyword argument 'scal'"),
    ],
)
def test_a_call_with_the_wrong_arguments_is_a_type_error(args, kwargs, problem):
    gauge = fake(Gauge, capacity=3)
    with pytest.raises(TypeError) as info:
        gauge.read(*args, **kwargs)
    assert str(info.value).startswith("Gauge.read(channel: int, *, scale: float = 1.0)")
    assert problem in str(info.value)
    assert gauge.calls == []


def test_calls_are_recorded_with_their_bound_arguments():
    gauge = fake(Gauge, capacity=3)
    gauge.read(2)
    gauge.read(channel=5, scale=0.5)
    assert Gauge.unit is not None and gauge.unit() is None
    assert gauge.calls == [
        ("read", (2,), {}),
        ("read", (), {"channel": 5, "scale": 0.5}),
        ("unit", (), {}),
    ]
    first, second = gauge.calls_to("read")
    assert isinstance(first, Call) and first.name == "read"
    assert first.arguments == {"channel": 2, "scale": 1.0}
    assert second.arguments == {"channel": 5, "scale": 0.5}
    assert gauge.named("x") is None and gauge.calls_to("named")[0].arguments == {"label": "x"}
    with pytest.raises(AttributeError, match="Gauge has no method 'reset'"):
        gauge.calls_to("reset")


def test_return_values_and_side_effects():
    seen = []
    gauge = fake(
        Gauge,
        capacity=3,
        returns={"unit": "mV"},
        side_effects={"read": lambda channel, scale=1.0: seen.append(channel) or channel * 10},
    )
    assert gauge.unit() == "mV"
    assert gauge.read(4) == 40 and seen == [4]
    gauge.returns["unit"] = "kV"
    gauge.side_effects["read"] = lambda *a, **k: (_ for _ in ()).throw(OSError("gone"))
    assert gauge.unit() == "kV"
    with pytest.raises(OSError, match="gone"):
        gauge.read(1)
    assert len(gauge.calls_to("read")) == 2  # a call that raised is still recorded
    with pytest.raises(TypeError, match="Gauge has no method 'reset'; methods: named, read"):
        fake(Gauge, returns={"reset": 1})


def test_fields_properties_and_frozen_attributes():
    gauge = fake(Gauge, capacity=3, full=True)
    assert gauge.full is True
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        gauge.capacity = 4
    with pytest.raises(AttributeError, match="'colour' on fake Gauge: it is not a field"):
        gauge.colour = "red"
    with pytest.raises(AttributeError, match="'read' on fake Gauge: it is a method"):
        gauge.read = None
    with pytest.raises(TypeError, match=r"unknown attribute\(s\) 'colour'; fields and prop"):
        fake(Gauge, colour="red")
    with pytest.raises(AttributeError, match=r"field 'capacity' has no value; pass fake\(Gauge"):
        _ = fake(Gauge).capacity
    with pytest.raises(AttributeError, match="property 'full' has no value"):
        _ = fake(Gauge, capacity=1).full


def test_a_mutable_component_fake_takes_new_field_values():
    streamer = fake(OutputStreamer)
    assert streamer.stream_interval == 1 and streamer.enable_hicache_storage() is False
    streamer.stream_interval = 4
    assert streamer.stream_interval == 4
    with pytest.raises(AttributeError, match="it is not a field"):
        streamer.interval = 4


def test_private_fields_are_set_by_their_constructor_alias_or_name():
    publisher = fake(KvEventsPublisher, publisher="p", shut_down=True)
    assert publisher._publisher == "p" and publisher._shut_down is True
    assert publisher.flush(1.0) is None
    assert publisher.calls_to("flush")[0].arguments == {"timeout": 1.0}


def test_fakes_stand_in_for_the_neighbours_of_a_real_component():
    streamer, cache = fake(OutputStreamer), fake(RadixCache, page_size=1)
    processor = BatchResultProcessor(tree_cache=cache, output_streamer=streamer)
    going = Req(
        rid="going", origin_input_ids=[1, 2], sampling_params=SamplingParams(max_new_tokens=5)
    )
    batch = ScheduleBatch(reqs=[going], forward_mode=ForwardMode.DECODE)
    processor.process_batch_result(batch, GenerationBatchResult(next_token_ids=[9]))
    assert going.output_ids == [9] and going.finished_reason is None
    assert cache.calls == []  # an unfinished decode request does not touch the cache
    (call,) = streamer.calls
    assert call == ("stream_output", ([going], False), {})
    assert call.arguments["reqs"] is batch.reqs and call.arguments["skip_req"] is None


def test_a_fake_of_a_protocol_refuses_to_invent_return_values():
    from schedkit.core.protocols import KVAllocator, LoadInquirerComponent
    from schedkit.testing import UnconfiguredCall

    allocator = fake(KVAllocator, size=64, page_size=16)
    assert allocator.size == 64
    with pytest.raises(UnconfiguredCall, match=r"KVAllocator\.alloc\(n: 'int'\)"):
        allocator.alloc(16)
    allocator.returns["alloc"] = [0, 1]
    assert allocator.alloc(16) == [0, 1]
    allocator.free([0, 1])  # declared to return None
    assert [c.name for c in allocator.calls] == ["alloc", "alloc", "free"]
    inquirer = fake(LoadInquirerComponent)
    with pytest.raises(AttributeError, match="field 'allocator' has no value"):
        _ = inquirer.allocator
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        inquirer.get_loads(sections=("core",))
