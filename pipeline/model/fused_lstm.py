"""A whole-sequence LSTM for the CPU with its backward pass written out.

Keras' LSTM layer runs its cell once per frame on a CPU and lets TensorFlow
differentiate the loop: every frame does the input product ``x @ kernel``
and the recurrent product ``h @ recurrent_kernel`` forwards, and four small
products backwards (two of them accumulating the weight gradients frame by
frame). At the sample geometry (batch 16, 150 to 300 frames, 384 units) that loop was
about 90% of a training step (``bench/step_profile.py``).

Here only what must be sequential runs per frame: forwards the recurrent
product and the gates, backwards the recurrent product of the gate gradients
and the two carried gradients. The input projection, the weight gradients and
the input gradient are single large matrix products over all frames, which a
CPU computes several times faster per operation than hundreds of small ones. The
result is the same function as Keras' LSTM (gate order i, f, c, o; sigmoid and
tanh; zero initial state), equal to float rounding.
"""

from __future__ import annotations

import tensorflow as tf


def lstm_sequence(x: tf.Tensor, kernel: tf.Tensor, recurrent_kernel: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """Outputs ``h`` ``[time, batch, units]`` of an LSTM over time-major ``x`` ``[time, batch, inputs]``
    from a zero state, with Keras' weights: ``kernel [inputs, 4 units]``, ``recurrent_kernel
    [units, 4 units]``, ``bias [4 units]`` (gates i, f, c, o). Differentiable in all four arguments."""
    dtype = x.dtype
    return _lstm(x, tf.cast(kernel, dtype), tf.cast(recurrent_kernel, dtype), tf.cast(bias, dtype))


@tf.custom_gradient
def _lstm(x, kernel, recurrent_kernel, bias):
    time, batch = tf.shape(x)[0], tf.shape(x)[1]
    n_inputs, units = kernel.shape[0], recurrent_kernel.shape[0]
    projected = tf.reshape(tf.matmul(tf.reshape(x, [-1, n_inputs]), kernel) + bias, [time, batch, 4 * units])
    zeros = tf.zeros([batch, units], x.dtype)

    def frames(tensor):
        # One frame of padding: XLA compiles a loop body's reads even when the loop never runs, and a read
        # of frame 0 of an empty sequence does not compile.
        return tf.pad(tensor, [[0, 1], [0, 0], [0, 0]])

    projected = frames(projected)

    def forward(t, h, c, gates, cells, outputs):
        z = projected[t] + tf.matmul(h, recurrent_kernel)
        i, f, g, o = tf.split(z, 4, axis=1)
        i, f, g, o = tf.sigmoid(i), tf.sigmoid(f), tf.tanh(g), tf.sigmoid(o)
        c = f * c + i * g
        h = o * tf.tanh(c)
        gates = gates.write(t, tf.concat([i, f, g, o], axis=1))
        return t + 1, h, c, gates, cells.write(t, c), outputs.write(t, h)

    widths = (4 * units, units, units)
    arrays = [tf.TensorArray(x.dtype, size=time, element_shape=[None, width]) for width in widths]
    _, _, _, *arrays = tf.while_loop(lambda t, *_: t < time, forward, (0, zeros, zeros, *arrays))
    gates, cells, outputs = (
        _stack(array, time, batch, width) for array, width in zip(arrays, widths, strict=True)
    )

    def backward(d_outputs):
        i, f, g, o = tf.split(gates, 4, axis=2)
        tanh_c = tf.tanh(cells)
        previous_c = tf.concat([zeros[None], cells], axis=0)[:time]
        # d(cell) gets d(h) * o * tanh'(c); each gate pre-activation's gradient is d(cell) (i, f, c) or
        # d(h) (o) times a factor that depends only on the forward values: computed for all frames at once.
        h_to_c = o * (1 - tanh_c * tanh_c)
        factors = tf.concat(
            [g * i * (1 - i), previous_c * f * (1 - f), i * (1 - g * g), tanh_c * o * (1 - o)], axis=2
        )
        recurrent_t = tf.transpose(recurrent_kernel)
        d_out, to_c, factor, forget = (frames(t) for t in (d_outputs, h_to_c, factors, f))

        def step_back(t, dh_next, dc_next, dz):
            dh = d_out[t] + dh_next
            dc = dc_next + dh * to_c[t]
            dz_t = tf.concat([dc, dc, dc, dh], axis=1) * factor[t]
            return t - 1, tf.matmul(dz_t, recurrent_t), dc * forget[t], dz.write(t, dz_t)

        dz = tf.TensorArray(x.dtype, size=time, element_shape=[None, 4 * units])
        _, _, _, dz = tf.while_loop(lambda t, *_: t >= 0, step_back, (time - 1, zeros, zeros, dz))
        dz = tf.reshape(_stack(dz, time, batch, 4 * units), [-1, 4 * units])
        previous_h = tf.reshape(tf.concat([zeros[None], outputs], axis=0)[:time], [-1, units])
        d_x = tf.reshape(tf.matmul(dz, kernel, transpose_b=True), tf.shape(x))
        d_kernel = tf.matmul(tf.reshape(x, [-1, n_inputs]), dz, transpose_a=True)
        d_recurrent = tf.matmul(previous_h, dz, transpose_a=True)
        return d_x, d_kernel, d_recurrent, tf.reduce_sum(dz, axis=0)

    return outputs, backward


def _stack(array: tf.TensorArray, time, batch, width) -> tf.Tensor:
    """``array``'s frames as ``[time, batch, width]`` (an empty array stacks to shape [0] in eager mode)."""
    return tf.reshape(array.stack(), [time, batch, width])
