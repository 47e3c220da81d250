"""keras_transformer.console: what the commands' quiet mode keeps off a user's terminal."""

import os

import pytest

from helpers import CACHE_HIT, LITERT_DELEGATE, ONEDNN_FALLBACK

from keras_transformer.console import HARMLESS_CACHE_LINES, HARMLESS_LINES, stderr_without


def test_stderr_without_drops_only_the_named_lines_from_file_descriptor_2(capfd):
    """C++ code writes to file descriptor 2, not through sys.stderr: the lines written there
    inside the block come back in order, less those naming a harmless message."""
    with stderr_without(HARMLESS_CACHE_LINES):
        os.write(2, b"first line\n" + CACHE_HIT.encode() + b"E0000 a real error\n")
        os.write(2, CACHE_HIT.encode())
    assert capfd.readouterr().err == "first line\nE0000 a real error\n"


def test_stderr_without_gives_back_the_lines_and_the_error_when_the_block_raises(capfd):
    with pytest.raises(ValueError, match="the request failed"):
        with stderr_without(HARMLESS_CACHE_LINES):
            os.write(2, CACHE_HIT.encode() + b"E0000 why it failed\n")
            raise ValueError("the request failed")
    assert capfd.readouterr().err == "E0000 why it failed\n"
    os.write(2, b"after\n")  # file descriptor 2 is the terminal's again
    assert capfd.readouterr().err == "after\n"


def test_the_commands_drop_the_cache_hits_onednns_fallback_and_litert_delegate_notices_only(capfd):
    with stderr_without(HARMLESS_LINES):
        os.write(2, (ONEDNN_FALLBACK + "E0000 util.cc:131] oneDNN supports DT_INT32, a line of another text\n"
                     + CACHE_HIT + LITERT_DELEGATE).encode())
    assert capfd.readouterr().err == "E0000 util.cc:131] oneDNN supports DT_INT32, a line of another text\n"
