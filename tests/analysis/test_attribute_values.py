"""The one attribute follower (`Kinds.attribute_values`): what `self.x`, `obj.x` or
`args.x` may hold, asked by the kinds of values, the numbers, the layouts, the training
facts and the loaders alike. Each case names the answer one of the followers it
replaced got wrong or could not give."""

from __future__ import annotations

import textwrap

import libcst as cst

from codemod.analysis.values import INT, values
from codemod.context import FileContext


def context(code: str) -> FileContext:
    return FileContext.of_source(textwrap.dedent(code))


def read(ctx: FileContext, spelled: str) -> cst.Attribute:
    """The first `spelled` attribute read in a `print(...)` call."""
    found = [
        a
        for call in ctx.index.find(cst.Call)
        if ctx.source(call.func) == "print"
        for a in ctx.index.find(cst.Attribute, within=call)
        if ctx.source(a) == spelled
    ]
    return found[0]


def held(ctx: FileContext, spelled: str, written: bool = False) -> list[str] | None:
    found = ctx.kinds.attribute_values(read(ctx, spelled), written)
    return None if found is None else [ctx.source(v) for v in found]


def test_the_methods_of_its_class_init_first_and_not_another_objects_attribute():
    ctx = context(
        """\
        class T:
            def reset(me):
                me.loader = None

            def __init__(self, make):
                self.loader = make()
                other.loader = 3

            def run(self):
                print(self.loader)

        def f(self):
            print(self.loader)
        """
    )
    assert held(ctx, "self.loader") == ["make()", "None"]
    outside = [a for a in ctx.index.find(cst.Attribute) if ctx.source(a) == "self.loader"][-1]
    assert ctx.kinds.attribute_values(outside) is None  # not in a class


def test_an_instance_holds_what_its_class_and_the_file_assign():
    ctx = context(
        """\
        class Holder:
            def __init__(self):
                self.scale = 2

        holder = Holder()
        holder.scale = 3
        print(holder.scale)
        """
    )
    assert held(ctx, "holder.scale") == ["2", "3"]


def test_a_tuple_assigned_to_attributes_is_unpacked():
    ctx = context(
        """\
        import torch

        class Pair:
            def __init__(self, n):
                self.left, self.right = torch.zeros(n), n

            def show(self):
                print(self.left, self.right)
        """
    )
    assert held(ctx, "self.left") == ["torch.zeros(n)"]
    assert held(ctx, "self.right") == ["n"]


def test_an_updated_attribute_is_not_told():
    """`self.n += 0.5` makes `self.n` a float: the training facts' follower, which left
    augmented assignments out, took it for the int of `__init__`."""
    ctx = context(
        """\
        class Counter:
            def __init__(self):
                self.n = 3

            def tick(self):
                self.n += 0.5

            def show(self):
                print(self.n)
        """
    )
    assert held(ctx, "self.n") is None
    assert values(ctx).number(read(ctx, "self.n")) != INT


def test_a_registered_buffer_is_an_attribute_and_a_declaration_assigns_nothing():
    ctx = context(
        """\
        import torch
        from torch import nn

        class Masked(nn.Module):
            mask: torch.Tensor

            def __init__(self, n):
                super().__init__()
                self.size: int
                self.size = n
                self.register_buffer("mask", torch.ones(n, n).tril())

            def forward(self, x):
                print(self.mask, self.size)
        """
    )
    assert held(ctx, "self.mask") == ["torch.ones(n, n).tril()"]
    assert held(ctx, "self.size") == ["n"]


def test_a_name_set_at_run_time_hides_what_it_may_replace():
    ctx = context(
        """\
        import torch
        from torch import nn

        class Buffers(nn.Module):
            def __init__(self, names):
                super().__init__()
                self.weight = torch.ones(2)
                self.register_buffer("mask", torch.ones(2))
                for name in names:
                    self.register_buffer(name, torch.zeros(2))

            def forward(self):
                print(self.mask, self.weight)

        class Options:
            def __init__(self, **options):
                self.lr = 0.1
                for key, value in options.items():
                    setattr(self, key, value)

            def show(self):
                print(self.lr)
        """
    )
    assert held(ctx, "self.mask") is None
    assert held(ctx, "self.weight") == ["torch.ones(2)"]  # registering over it fails
    assert held(ctx, "self.lr") is None


def test_a_self_read_in_a_nested_function_is_the_methods_self():
    ctx = context(
        """\
        class Model:
            def __init__(self):
                self.width = 64

            def hook(self):
                def inner():
                    print(self.width)
                return inner
        """
    )
    assert held(ctx, "self.width") == ["64"]


def test_a_dataclass_field_holds_what_constructions_pass_or_its_default():
    ctx = context(
        """\
        from dataclasses import dataclass, field

        @dataclass
        class Config:
            lr: float = 1e-3
            steps: int = field(default=10)

        first = Config(0.5)
        second = Config()
        print(first.lr, second.lr, second.steps)
        """
    )
    assert held(ctx, "first.lr") == ["0.5"]  # by position: the training facts took the default
    assert held(ctx, "second.lr") == ["1e-3"]
    assert held(ctx, "second.steps") == ["10"]  # the default, not the `field(...)` call


def test_a_dataclass_field_written_after_construction_holds_its_default_too():
    ctx = context(
        """\
        from dataclasses import dataclass

        @dataclass
        class Config:
            save_every: int = 100
            lr: float = 1e-3

        cfg = Config(lr=0.5)
        cfg.save_every = 0
        cfg.lr = 0.1
        print(cfg.save_every, cfg.lr)
        """
    )
    assert held(ctx, "cfg.save_every") == ["100", "0"]  # the default until it is written
    assert held(ctx, "cfg.lr") == ["0.5", "0.1"]  # what the construction passes, until then


def test_an_option_holds_its_choices_or_as_written_its_default():
    ctx = context(
        """\
        import argparse

        parser = argparse.ArgumentParser()
        parser.add_argument("--opt", choices=["adam", "sgd"])
        parser.add_argument("--steps", type=int, default=100)
        args = parser.parse_args()
        print(args.opt, args.steps)
        """
    )
    assert held(ctx, "args.opt") == ['"adam"', '"sgd"']
    assert held(ctx, "args.steps") is None  # the command line may give any number
    assert held(ctx, "args.steps", written=True) == ["100"]


def test_a_config_handed_down_through_parameters_holds_what_its_construction_passes():
    ctx = context(
        """\
        from dataclasses import dataclass

        @dataclass
        class Config:
            width: int = 64

        class Block:
            def __init__(self, cfg):
                print(cfg.width)

        class Model:
            def __init__(self, cfg):
                self.block = Block(cfg)

        def build(config):
            return Model(config)

        model = build(Config(width=32))
        """
    )
    assert held(ctx, "cfg.width") == ["32"]


RECORDS = """\
from dataclasses import dataclass, field


@dataclass
class DataCfg:
    prompt: str = "tag the words"
    max_len: int = 4


@dataclass
class Cfg:
    scale: float = 0.25
    data: DataCfg = field(default_factory=DataCfg)


class Block:
    def __init__(self, cfg):
        self.cfg = cfg

    def forward(self):
        print(self.cfg.scale, self.cfg.data.prompt)


cfg = Cfg(scale=0.5)
Block(cfg).forward()
print(cfg.data.max_len)
"""


def test_down_a_chain_of_records_to_what_their_constructions_pass():
    """`self.cfg.scale` of the `Cfg(scale=0.5)` a construction passes; a field built by
    `field(default_factory=DataCfg)` holds a `DataCfg()`, whose fields keep their defaults."""
    ctx = context(RECORDS)
    assert held(ctx, "self.cfg.scale") == ["0.5"]
    assert values(ctx).number(read(ctx, "self.cfg.scale")) is not None  # a Python number: SDPA may take it
    assert held(ctx, "self.cfg.data.prompt") == ['"tag the words"']
    assert held(ctx, "cfg.data.max_len") == ["4"]
    assert ctx.kinds.instance_class(read(ctx, "cfg.data.max_len").value).name.value == "DataCfg"


def test_a_record_keeps_its_fields_apart_unless_its_class_can_run_code_on_them():
    ctx = context(RECORDS)
    assert ctx.kinds.stores_attributes_plainly(read(ctx, "cfg.data.max_len").value)
    for extra in (
        "    @property\n    def width(self):\n        return self.max_len * 2\n",
        "    def __setattr__(self, name, value):\n        object.__setattr__(self, name, value)\n",
        "    def grow(self):\n        self.max_len += 1\n",
        "    width = property(lambda self: self.max_len * 2)\n",
    ):
        code = RECORDS.replace("    max_len: int = 4\n", "    max_len: int = 4\n\n" + extra)
        ctx = context(code)
        assert not ctx.kinds.stores_attributes_plainly(read(ctx, "cfg.data.max_len").value), extra
