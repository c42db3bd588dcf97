"""Reading back what a run wrote to TensorBoard: its event files, and the images of an image tag decoded."""

import io

import numpy as np
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def read_events(log_dir) -> EventAccumulator:
    events = EventAccumulator(str(log_dir), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    return events


def decode(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))  # (H, W, 3)


def image_samples(events: EventAccumulator, tag: str) -> list[tuple[int, list[np.ndarray]]]:
    """The (step, [decoded image per sample]) of an image tag written as tf.summary.image does."""
    assert events.SummaryMetadata(tag).plugin_data.plugin_name == "images"
    out = []
    for event in events.Tensors(tag):
        width, height, *pngs = event.tensor_proto.string_val
        images = [decode(png) for png in pngs]
        assert all(image.shape == (int(height), int(width), 3) for image in images)
        out.append((event.step, images))
    return out
