"""The box predictor's classification loss: a named mapping of the long-tail losses; ``losses.use`` chooses.

    losses.use=fed                                   federated loss (Zhou et al. 2021), sigmoid scores
    -m losses.use=ce,fed,eqlv2,seesaw                compare them in one sweep
    losses.eqlv2.gamma=10                            change one loss's key
    model.roi_heads.box_predictor._target_=lazytrain.modeling.CosineBoxPredictor   cosine classifier (any loss)

Only the chosen node is built (the model's ``box_predictor.loss`` interpolates it), so the train image
counts the federated loss samples with are read from the train data set only when it is used. The losses,
their papers and defaults: `lazytrain.modeling.classification_losses`.
"""

from lazytrain.config import LazyCall as L
from lazytrain.data.class_frequency import get_class_image_counts
from lazytrain.modeling import EQLv2Loss, FederatedLoss, SeesawLoss, SoftmaxCrossEntropy

losses = dict(
    use="ce",  # the key of the loss below that the box predictor trains and scores with
    ce=L(SoftmaxCrossEntropy)(),
    fed=L(FederatedLoss)(
        num_classes="${model.num_classes}",
        class_image_counts=L(get_class_image_counts)(dataset_names="${dataloader.train.dataset.names}"),
        num_sampled_classes=50,
        freq_weight_power=0.5,
    ),
    eqlv2=L(EQLv2Loss)(num_classes="${model.num_classes}", gamma=12.0, mu=0.8, alpha=4.0),
    seesaw=L(SeesawLoss)(num_classes="${model.num_classes}", p=0.8, q=2.0),
)
