"""The image batch (`lazytrain.modeling.image_batch.NoResizeTransform`): torchvision's normalisation and padding
without a resize, bit for bit, for all images at once, and training batches padded to fixed sizes
(`pad_to_sizes`) with a clear error where none holds them."""

import pytest
import torch
from torchvision.models.detection.transform import GeneralizedRCNNTransform

from lazytrain.modeling.image_batch import NoResizeTransform


def test_normalisation_equals_torchvisions_and_adds_no_checkpoint_keys():
    transform = NoResizeTransform([123.675, 116.28, 103.53], [58.395, 57.12, 57.375])
    image = torch.randint(0, 256, (3, 20, 30)).float()
    reference = GeneralizedRCNNTransform(1, 1, transform.image_mean, transform.image_std)
    assert torch.equal(transform.normalize(image), reference.normalize(image))
    assert not transform.state_dict()
    with pytest.raises(TypeError, match="float images"):
        transform.normalize(image.to(torch.uint8))


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize(
    "sizes, pad_to_sizes, training",
    [
        ([(20, 30), (33, 17), (64, 64)], None, False),  # padded to multiples of 32
        ([(20, 30), (33, 17)], [[64, 64], [96, 128]], True),  # a pad_to_sizes size in training
        ([(40, 70)], [[64, 64], [96, 128]], False),  # evaluation pads by size_divisible
    ],
)
def test_the_batch_for_all_images_at_once_is_torchvisions_bit_for_bit(
    sizes, pad_to_sizes, training, memory_format
):
    transform = NoResizeTransform(
        [123.675, 116.28, 103.53], [58.395, 57.12, 57.375], pad_to_sizes=pad_to_sizes
    ).train(training)
    generator = torch.Generator().manual_seed(len(sizes))
    images = [torch.randint(0, 256, (3, *size), generator=generator, dtype=torch.uint8) for size in sizes]
    expected = transform([image.float() for image in images])[0]
    for given in (images, [image.float() for image in images]):  # uint8 (the loader's) and float images
        batch = transform.normalized_batch(given, memory_format)
        assert torch.equal(batch.tensors, expected.tensors) and batch.image_sizes == expected.image_sizes
        assert batch.tensors.dtype == torch.float32 and batch.tensors.is_contiguous(
            memory_format=memory_format
        )


def _transform(pad_to_sizes):
    return NoResizeTransform([0.0] * 3, [1.0] * 3, 32, pad_to_sizes)


def _batch(transform, sizes):
    images = [torch.ones(3, height, width) for height, width in sizes]
    return transform(images)[0]


def test_training_batches_are_padded_to_the_smallest_size_that_holds_them():
    transform = _transform([[96, 96], [64, 96], [96, 64]]).train()
    assert transform.pad_to_sizes == ((64, 96), (96, 64), (96, 96))  # by area
    assert _batch(transform, [(50, 90), (40, 40)]).tensors.shape == (2, 3, 64, 96)
    assert _batch(transform, [(90, 50)]).tensors.shape == (1, 3, 96, 64)
    batch = _batch(transform, [(70, 70), (30, 20)])
    assert batch.tensors.shape == (2, 3, 96, 96) and batch.image_sizes == [(70, 70), (30, 20)]
    assert batch.tensors[1, :, :30, :20].eq(1).all() and batch.tensors[1].sum() == 3 * 30 * 20
    # Evaluation pads by size_divisible, as without pad_to_sizes.
    assert _batch(transform.eval(), [(50, 40)]).tensors.shape == (1, 3, 64, 64)


def test_a_training_batch_larger_than_every_size_is_refused_with_the_size_to_add():
    transform = _transform([[64, 64]]).train()
    with pytest.raises(ValueError) as error:
        _batch(transform, [(70, 40)])
    assert str(error.value) == (
        "RCNN(pad_to_sizes=[[64, 64]]): a training batch has images up to 70 x 40 px (height x width), which fit "
        "none of these sizes. Add a size that holds them (model.pad_to_sizes=[..., [96, 64]]) or make the train "
        "mapper's images smaller."
    )


@pytest.mark.parametrize("sizes", [[[64, 70]], [[64]], [64, 64], [[True, 64]], [], "64x64", [[0, 64]]])
def test_pad_to_sizes_must_be_pairs_of_multiples_of_size_divisible(sizes):
    with pytest.raises(ValueError, match=r"RCNN\(pad_to_sizes=\) must be a list of \[height, width\] pairs"):
        _transform(sizes)
