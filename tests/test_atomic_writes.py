"""The leaf helpers for atomic writes: the reason a write failed, in a few words."""


def test_write_failure_is_the_systems_reason_without_tensorflows_wrapping():
    import tensorflow as tf

    from keras_transformer.atomic_writes import write_failure

    wrapped = tf.errors.ResourceExhaustedError(None, None, "{{function_node __wrapped__SaveV2_dtypes_259_device_/job:"
                                               "localhost/replica:0/task:0/device:CPU:0}} /r/ckpt-20_temp/part-0.tempstate"
                                               "44; No space left on device [Op:SaveV2]")
    assert write_failure(wrapped) == "No space left on device"
    assert write_failure(OSError(28, "No space left on device")) == "No space left on device"
    assert write_failure(PermissionError(13, "Permission denied", "/r/x")) == "Permission denied"
    assert write_failure(RuntimeError("first line; second part\nmore")) == "first line; second part"
