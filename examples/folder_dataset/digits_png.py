"""A dataset plugin: the image folders that make_dataset.py writes, registered as
``digits-png`` (``raydg run digits-png --plugin examples/folder_dataset/digits_png.py
--data-root ROOT``). Any folder in DomainBed's layout is registered the same way."""

from raydg.datasets import TrainDefaults
from raydg.datasets.folders import domainbed

domainbed(
    "digits-png", "digits_png", ("plain", "colour-inverted", "sketch", "texture"),
    "the embedded digits as PNG files (examples/folder_dataset)",
    defaults=TrainDefaults(rounds=10, local_steps=20, lr=0.05, momentum=0.5, batch_size=32,
                           model="cnn", image_size=16, val_every=2),
)
