"""The audio a pipeline returns beside its frames (LTX-2, Kandinsky 6): which waveform is kept, at what rate,
and how the MP4 writers (`run`'s and the console's) carry it (engine/running/audio_track.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch


def test_an_audio_track_of_more_than_two_channels_is_refused_in_one_line(tmp_path):
    import io

    from omni_console.engine.running.audio_track import AudioTrack
    from omni_console.engine.running.video_encoders import encode_mp4

    frames = [np.zeros((8, 8, 3), np.uint8)] * 2
    with pytest.raises(ValueError, match="^audio with 3 channels: an MP4 here carries mono or stereo$"):
        encode_mp4(frames, io.BytesIO(), 8.0, AudioTrack(np.zeros((3, 100), np.float32), 16000))


def test_the_consoles_saved_video_keeps_the_audio_too(tmp_path):
    """The console's save (a new name in its output folder) writes a result's audio as `run` does."""
    from types import SimpleNamespace

    import av

    from omni_console.console.outputs import save_result
    from omni_console.engine.running.audio_track import AudioTrack, pcm16

    track = AudioTrack(np.linspace(-1.5, 1.5, 2 * 300, dtype=np.float32).reshape(2, 300), 8000)
    result = SimpleNamespace(is_video=True, frames=[np.zeros((8, 8, 3), np.uint8)] * 3, fps=8.0, image=None,
                             audio=track)
    path = save_result(result, tmp_path, 1)
    with av.open(str(path)) as container:
        (audio,) = container.streams.audio
        assert (audio.rate, audio.codec_context.channels) == (8000, 2)
        decoded = np.concatenate([f.to_ndarray() for f in container.decode(audio)], axis=-1)
    assert np.array_equal(decoded.reshape(-1, 2).T, pcm16(track))  # clipped to [-1, 1], 16-bit, lossless


@pytest.mark.parametrize(("audio", "rate", "expected"), [
    (torch.zeros(1, 2, 10), 16000, (2, 10)),  # LTX-2: [batch, channels, samples]
    (torch.zeros(1, 10), 24000, (1, 10)),  # Kandinsky 6: [batch, samples], mono
    (None, 16000, None),  # audio not sampled
])
def test_the_first_items_waveform_is_kept_at_the_vocoders_rate(audio, rate, expected):
    from types import SimpleNamespace

    from omni_console.engine.running.audio_track import first_item_audio

    pipe = SimpleNamespace(vocoder=SimpleNamespace(config=SimpleNamespace(output_sampling_rate=rate)))
    track = first_item_audio(SimpleNamespace(frames=[[]], audio=audio), pipe)
    assert (track.samples.shape, track.sample_rate) == (expected, rate) if expected else track is None


@pytest.mark.parametrize("rate", [0, 10**12, True, 16000.5])
def test_a_waveform_at_no_storable_rate_is_one_line(rate):
    from types import SimpleNamespace

    from omni_console.engine.running.audio_track import first_item_audio

    pipe = SimpleNamespace(vocoder=SimpleNamespace(config=SimpleNamespace(output_sampling_rate=rate)))
    with pytest.raises(ValueError, match=r"^SimpleNamespace returned audio of shape \(2, 10\) at no rate its "
                                         r"vocoder names \(1 to 655350 Hz\): cannot keep it$"):
        first_item_audio(SimpleNamespace(audio=torch.zeros(1, 2, 10)), pipe)
