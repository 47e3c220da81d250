"""The exporters' one error type: a conversion that cannot be made as asked (a
one-line message for the command line)."""


class ConversionError(ValueError):
    """A model, an option or a converted result that an exporter refuses: the options
    asked for something it cannot give (CTranslate2), or the converted model would not
    run where it is going (LiteRT with TF Text's kernels)."""
