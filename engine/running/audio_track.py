"""The audio a pipeline returns: beside a video's frames (LTX-2), as a stream in the MP4 that `run` writes, or
alone (Stable Audio, ACE-Step, AudioLDM 2: an `audios` field), as a `.wav` or `.flac` file.

A pipeline output with an `audio` field holds one waveform per batch item, [channels, samples],
floats in [-1, 1], at the vocoder's output rate (`vocoder.config.output_sampling_rate`, which
diffusers' own LTX-2 example passes to its `encode_video`). The first item's waveform is kept with
the frames (`AudioTrack`), and the MP4 gets it as a second stream at that rate, its samples made
16-bit as diffusers' `encode_video` makes them (clipped to [-1, 1], times 32767, truncated), then
stored losslessly as FLAC: decoding the file gives back exactly those 16-bit samples (diffusers'
AAC would not: on short or noisy waveforms its error is of the signal's size). Mono stays mono,
stereo stays stereo; more channels are refused with one line.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is imported where a waveform is handled: `run`'s early refusals import this module
    import numpy as np

AUDIO_CODEC = "flac"  # lossless in MP4 (ISO/IEC 14496-12 FLAC mapping); plays in browsers, VLC, FFmpeg
AUDIO_LAYOUTS = {1: "mono", 2: "stereo"}
MAX_SAMPLE_RATE = 655_350  # the highest rate FLAC stores
RATE_KEYS = ("output_sampling_rate", "sampling_rate", "sample_rate")
"""Config keys of the vocoder (then the audio VAE) that name the waveform's rate, in order."""


@dataclass(frozen=True, slots=True)
class AudioTrack:
    """One waveform: `samples` [channels, samples] float32, `sample_rate` in Hz."""

    samples: np.ndarray
    sample_rate: int

    @property
    def channels(self) -> int:
        return int(self.samples.shape[0])

    @property
    def seconds(self) -> float:
        return self.samples.shape[1] / self.sample_rate


def audio_sample_rate(pipe: Any) -> int | None:
    """The rate the pipeline's waveform is at: its vocoder's output rate, else its audio VAE's, else its VAE's
    (Stable Audio's and ACE-Step's Oobleck VAE name it; a config value, so only a rate FLAC can store counts)."""
    for name in ("vocoder", "audio_vae", "vae"):
        config = getattr(getattr(pipe, name, None), "config", None)
        for key in RATE_KEYS:
            value = getattr(config, key, None) if config is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_SAMPLE_RATE:
                return value
    return None


def first_item_audio(output: Any, pipe: Any) -> AudioTrack | None:
    """The first batch item's waveform of a pipeline output, or None when it has no audio."""
    import numpy as np

    audio = next((value for name in ("audio", "audios") if (value := getattr(output, name, None)) is not None), None)
    if audio is None or len(audio) == 0:
        return None
    first = audio[0]
    array = first.detach().float().cpu().numpy() if hasattr(first, "detach") else np.asarray(first, np.float32)
    array = array.reshape(1, -1) if array.ndim == 1 else array
    rate = audio_sample_rate(pipe)
    if array.ndim != 2 or rate is None:
        raise ValueError(f"{type(pipe).__name__} returned audio of shape {tuple(array.shape)}"
                         f"{'' if rate else f' at no rate its vocoder names (1 to {MAX_SAMPLE_RATE} Hz)'}: "
                         "cannot keep it")
    return AudioTrack(np.ascontiguousarray(array, dtype=np.float32), rate)


def check_audio(track: AudioTrack, pipeline: str) -> None:
    """Refuse a waveform that is NaN anywhere (a non-finite value in the run) or silent everywhere."""
    import numpy as np

    from ..errors import OutputError

    if not np.isfinite(track.samples).all():
        raise OutputError(f"{pipeline} returned audio with NaN or infinite samples (a non-finite value in the run): "
                          "no file written")
    if not track.samples.any():
        raise OutputError(f"{pipeline} returned silent audio (zero everywhere): no file written")


def audio_file_note(name: str, track: AudioTrack, suffix: str) -> str:
    """The report's line on an audio-only result's file."""
    what = f"{track.channels}-channel audio, {track.samples.shape[1]} samples ({track.seconds:.2f} s) at " \
           f"{track.sample_rate} Hz"
    how = "32-bit float PCM (the pipeline's samples exactly)" if suffix == ".wav" else \
        "16-bit FLAC (lossless of the 16-bit samples)"
    return f"{name}: the pipeline's {what}, as {how}"


def encode_audio_file(track: AudioTrack, stream: Any, suffix: str) -> None:
    """Write `track` as a whole `.wav` (32-bit float samples, exactly the pipeline's) or `.flac` (16-bit, as the
    MP4's track) file into a binary stream, through PyAV."""
    import av

    wav = suffix == ".wav"
    with av.open(stream, "w", format="wav" if wav else "flac") as container:
        out = add_audio_stream(container, track, "pcm_f32le" if wav else AUDIO_CODEC, f"a {suffix} file")
        mux_audio(container, out, track, exact=wav)


def audio_note(name: str, track: AudioTrack, *, kept: bool) -> str:
    """The report's line on the pipeline's audio: how the MP4 carries it, or that this target drops it."""
    what = f"{track.channels}-channel audio, {track.samples.shape[1]} samples at {track.sample_rate} Hz"
    if kept:
        return f"{name}: with the pipeline's {what}, as 16-bit {AUDIO_CODEC.upper()} (lossless)"
    return f"{name}: the pipeline's {what} is not kept (only an .mp4 output carries it)"


def pcm16(track: AudioTrack) -> np.ndarray:
    """The samples as diffusers' `encode_video` stores them: clipped to [-1, 1], times 32767, as int16."""
    import numpy as np

    return (np.clip(track.samples, -1.0, 1.0) * 32767.0).astype(np.int16)


def add_audio_stream(container: Any, track: AudioTrack, codec: str = AUDIO_CODEC, carrier: str = "an MP4") -> Any:
    """A stream for `track` in an open PyAV output container (FLAC unless `codec` says otherwise)."""
    layout = AUDIO_LAYOUTS.get(track.channels)
    if layout is None:
        raise ValueError(f"audio with {track.channels} channels: {carrier} here carries mono or stereo")
    stream = container.add_stream(codec, rate=track.sample_rate)
    stream.layout = layout
    return stream


def mux_audio(container: Any, stream: Any, track: AudioTrack, *, exact: bool = False) -> None:
    """Encode every sample of `track` into `stream` (PyAV splits it into the codec's frames) and flush:
    16-bit (`pcm16`), or `exact`: the float32 samples as they are."""
    import av
    import numpy as np

    samples, sample_format = (track.samples, "flt") if exact else (pcm16(track), "s16")
    packed = samples.T.reshape(1, -1)  # packed formats: the channels interleaved
    frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(packed), format=sample_format, layout=stream.layout.name)
    frame.sample_rate, frame.pts = track.sample_rate, 0
    for packet in stream.encode(frame):
        container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)
