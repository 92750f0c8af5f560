"""OpInfo ops that cannot be compared with eager, and why (see ``kiln.testing.torch_opinfo``).

An op is listed here only when no implementation could match eager sample by sample: its
result is random or uninitialized memory. Ops kiln does not (yet) support are not excluded:
they count as failures in the pass table.
"""

from __future__ import annotations

#: OpInfo name -> reason.
EXCLUDED_OPS: dict[str, str] = {
    **dict.fromkeys(
        ["bernoulli", "normal", "normal.number_mean", "rand_like", "randint", "randint_like",
         "randn", "randn_like", "multinomial", "uniform", "exponential", "geometric",
         "log_normal", "cauchy", "nn.functional.dropout", "nn.functional.dropout2d",
         "nn.functional.dropout3d", "nn.functional.alpha_dropout",
         "nn.functional.feature_alpha_dropout.with_train",
         "nn.functional.feature_alpha_dropout.without_train",
         "nn.functional.rrelu", "nn.functional.fractional_max_pool2d",
         "nn.functional.fractional_max_pool3d",
         "randperm", "bernoulli.p"],
        "random result: a fresh draw of the generator, not comparable value by value"),
    **dict.fromkeys(
        ["empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
         "empty_permuted", "torch.empty", "resize_", "resize_as_"],
        "uninitialized memory: the values are unspecified"),
}
