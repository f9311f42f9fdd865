"""`get_parameters`: a class's ``**kwargs`` (and ``*args``) followed into the base ``__init__`` that receives
them, so that validation names a misspelled base argument."""

import inspect

import pytest
import torch
from omegaconf import OmegaConf
from pytest import param

from lazytrain.config import L, find_problems
from lazytrain.config.signatures import get_parameters
from lazytrain.modeling.classification_losses import SoftmaxCrossEntropy
from lazytrain.modeling.roi_heads import RoIHeads


class Base:
    def __init__(self, size, *, depth=1, width=2):
        self.size, self.depth, self.width = size, depth, width


class PassesAll(Base):
    def __init__(self, *args, extra=0, **kwargs):
        super().__init__(*args, **kwargs)
        self.extra = extra


class PassesKeywordsOnly(Base):
    def __init__(self, size, **kwargs):
        super().__init__(size, **kwargs)


class FixesOne(Base):
    def __init__(self, **kwargs):
        Base.__init__(self, 3, width=4, **kwargs)


class TwoLevels(PassesAll):
    def __init__(self, *args, tag="", **kwargs):
        super().__init__(*args, **kwargs)
        self.tag = tag


class Inherits(PassesAll):
    pass


class KeepsKeywords(Base):
    def __init__(self, size, **options):
        super().__init__(size)
        self.options = options  # any key goes into a dict: anything is accepted


def _names(target):
    return [p.name for p in get_parameters(target)]


@pytest.mark.parametrize(
    ("target", "names"),
    [
        param(PassesAll, ["extra", "size", "depth", "width"], id="args-and-kwargs"),
        param(PassesKeywordsOnly, ["size", "depth", "width"], id="kwargs"),
        param(FixesOne, ["depth"], id="base-called-by-name-filling-two"),
        param(TwoLevels, ["tag", "extra", "size", "depth", "width"], id="two-levels"),
        param(Inherits, ["extra", "size", "depth", "width"], id="inherited-init"),
        param(KeepsKeywords, ["size", "options"], id="kwargs-kept"),
        param(SoftmaxCrossEntropy, [], id="nn-module-takes-nothing"),
    ],
)
def test_kwargs_are_followed_into_the_base_init(target, names):
    assert _names(target) == names


def test_positional_parameters_keep_their_order_when_args_are_passed_on():
    kinds = {p.name: p.kind for p in get_parameters(PassesAll)}
    assert kinds["size"] is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert kinds["extra"] is inspect.Parameter.KEYWORD_ONLY
    # Only by keyword when *args is not passed on: PassesKeywordsOnly(size) fills the base's size itself.
    assert [p.name for p in get_parameters(PassesKeywordsOnly) if p.kind in (p.POSITIONAL_OR_KEYWORD,)] == [
        "size"
    ]


def test_functions_and_classes_without_var_keyword_keep_their_signature():
    assert _names(Base) == ["size", "depth", "width"]
    assert get_parameters(lambda *a, **k: None)[-1].kind is inspect.Parameter.VAR_KEYWORD
    assert get_parameters(torch.nn.Linear) == list(inspect.signature(torch.nn.Linear).parameters.values())


def test_roi_heads_accepts_torchvision_names_and_names_a_misspelled_one():
    names = _names(RoIHeads)
    assert (
        names[:4] == ["compiled_nms", "detections_per_class", "detection_min_size", "box_roi_pool"]
        and "batch_size_per_image" in names
    )
    cfg = OmegaConf.create({"heads": L(PassesAll)(3, extra=1, widht=2)})
    assert find_problems(cfg) == [
        "heads.widht: tests.config.test_signatures.PassesAll has no argument 'widht'. Did you mean 'width'? "
        "Accepted: extra, size, depth, width."
    ]


def test_a_required_base_argument_is_missing_and_a_positional_one_counts():
    assert find_problems(OmegaConf.create({"a": L(PassesAll)(extra=1)})) == [
        "a.size: missing required argument 'size' of tests.config.test_signatures.PassesAll."
    ]
    assert find_problems(OmegaConf.create({"a": L(PassesAll)(3)})) == []
    assert find_problems(OmegaConf.create({"a": L(FixesOne)(size=1)})) == [  # the call passes it
        "a.size: tests.config.test_signatures.FixesOne has no argument 'size'. Accepted: depth."
    ]
    assert find_problems(OmegaConf.create({"a": L(SoftmaxCrossEntropy)(weight=1)})) == [
        "a.weight: lazytrain.modeling.classification_losses.SoftmaxCrossEntropy has no argument 'weight'. It "
        "takes no keyword arguments."
    ]


class MadeByNew:
    def __new__(cls, *args, **kwargs):
        return super().__new__(cls)


def test_a_signature_from_new_is_kept():
    assert [p.kind for p in get_parameters(MadeByNew)] == [
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.VAR_KEYWORD,
    ]
