"""`check_parity`: detections matched across the two outputs, each quantity out of tolerance named with its
image, a few unmatched detections allowed."""

import pytest
import torch

from lazytrain.config import instantiate
from lazytrain.modeling.export import ExportableRCNN
from lazytrain.modeling.export_parity import check_parity
from tests.modeling.helpers import load_model_config, make_record

# A random-init model scores every class near 1/(K+1): threshold 0 keeps 20 detections per image.
OVERRIDES = (
    "model.num_classes=3",
    "model.roi_heads.score_thresh=0.0",
    "model.roi_heads.detections_per_img=20",
)
SIZES = [(128, 160), (96, 200), (200, 120), (192, 224), (72, 96)]


@pytest.fixture(scope="module")
def mask_model():
    torch.manual_seed(0)
    return instantiate(load_model_config(overrides=OVERRIDES).model).eval()


@pytest.fixture(scope="module")
def images():
    return [make_record(height, width, seed=seed)["image"] for seed, (height, width) in enumerate(SIZES)]


def _perturbed(wrapper, change):
    def detect(image, original_size):
        with torch.no_grad():
            return change(list(wrapper(image, original_size)))

    return detect


def _shift_boxes(outputs):
    outputs[0] = outputs[0] + torch.tensor([0.5, 0.0, 0.0, 0.0])
    return outputs


def _raise_scores(outputs):
    outputs[1] = outputs[1] + 0.01
    return outputs


def _drop_best_seven(outputs):
    return [t[7:] for t in outputs]


def _relabel_best_four(outputs):
    outputs[2] = outputs[2].clone()
    outputs[2][:4] = (outputs[2][:4] + 1) % 3
    return outputs


def _flip_mask_pixels(outputs):
    outputs[3] = outputs[3].clone()
    outputs[3][0, :40, :40] ^= 1
    return outputs


FIRST = r"First, image 0: detection 0 \(class \d, score 0.\d+\)"
NO_OVERLAP = "has no detection of its class overlapping it"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param(
            _shift_boxes,
            r"40 detections of 40 \(both outputs\) have no match within box_atol=0.05 and score_atol=0.0005, "
            rf"more than max_unmatched=0.01 \(and 6\) allow. {FIRST}: boxes differ by 0.5 px and scores by 0 "
            r"from the export's detection 0",
            id="boxes",
        ),
        pytest.param(
            _raise_scores,
            rf"40 detections of 40 .* {FIRST}: boxes differ by 0 px and scores by 0.01",
            id="scores",
        ),
        pytest.param(_drop_best_seven, rf"7 detections of 33 .* {FIRST} {NO_OVERLAP}", id="missing"),
        pytest.param(_relabel_best_four, rf"8 detections of 40 .* {FIRST} {NO_OVERLAP}", id="classes"),
        pytest.param(
            _flip_mask_pixels, r"image 0: masks agree on \d+.\d+% of their pixels, less than", id="masks"
        ),
        pytest.param(
            lambda outputs: outputs[:3],
            r"image 0: the reference returns 4 outputs, the export 3",
            id="outputs",
        ),
    ],
)
def test_check_parity_names_the_image_and_the_quantity_out_of_tolerance(mask_model, images, change, message):
    wrapper = ExportableRCNN(mask_model)
    with pytest.raises(ValueError, match=rf"check_parity: {message}"):
        check_parity(wrapper, _perturbed(wrapper, change), images[:1])


def test_check_parity_matches_swapped_detections_and_allows_a_few_unmatched(mask_model, images):
    wrapper = ExportableRCNN(mask_model)

    def swap_two_and_drop_worst_four(outputs):
        order = torch.tensor([1, 0, *range(2, len(outputs[0]) - 4)])
        return [t[order] for t in outputs]

    report = check_parity(wrapper, _perturbed(wrapper, swap_two_and_drop_worst_four), images[:1])
    assert report.num_detections == 20 and report.num_unmatched == 4
    assert report.max_box_diff == report.max_score_diff == 0.0 and report.min_mask_agreement == 1.0
    assert str(report).endswith("masks agree on 100.0000%, 4 unmatched (ties)")
    # Above the floor of 6, the share decides: 8 of 192 detections is 4.2%.
    drops = iter([8, 0, 0, 0, 0] * 2)  # in the first of the five images, for each of the two calls

    def drop_worst(outputs):
        count = len(outputs[0]) - next(drops)
        return [t[:count] for t in outputs]

    eight = _perturbed(wrapper, drop_worst)
    assert check_parity(wrapper, eight, images[:5], max_unmatched=0.05).num_unmatched == 8
    with pytest.raises(ValueError, match=r"8 detections of 192 .* more than max_unmatched=0.03"):
        check_parity(wrapper, eight, images[:5], max_unmatched=0.03)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        pytest.param({"box_atol": -1.0}, r"check_parity\(box_atol=\) must be >= 0; got -1.0", id="box"),
        pytest.param({"mask_agreement": 1.5}, r"\(mask_agreement=\) must be a share in \[0, 1\]", id="mask"),
        pytest.param(
            {"max_unmatched": -0.1}, r"check_parity\(max_unmatched=\) must be a share", id="unmatched"
        ),
    ],
)
def test_check_parity_rejects_bad_tolerances(arguments, message):
    with pytest.raises(ValueError, match=message):
        check_parity(None, None, [], **arguments)


def test_check_parity_compares_in_the_original_sizes_given(mask_model, images):
    wrapper = ExportableRCNN(mask_model)
    sizes = [(2 * image.shape[1], 2 * image.shape[2]) for image in images[:2]]
    seen = []

    def recording(image, original_size):
        seen.append(original_size.tolist())
        return wrapper(image, original_size)

    report = check_parity(wrapper, recording, images[:2], sizes)
    assert seen == [list(size) for size in sizes] and report.num_unmatched == 0
    with pytest.raises(ValueError, match=r"2 images but 1 original_sizes"):
        check_parity(wrapper, wrapper, images[:2], sizes[:1])
