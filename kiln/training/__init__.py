"""Training: losses and optimizers as graph code, and a compiled train step.

```python
from kiln import training

trainer = training.Trainer(build_model, training.SoftmaxCrossEntropy(),
                           training.SGD(lr=0.1, momentum=0.9), params=init, batch_size=32)
for xb, yb in batches:
    loss = trainer.step(xb, yb)        # forward + backward + update: one native call
probs = trainer.predict(x_test)
```

A loss (:mod:`~kiln.training.loss`) and an optimizer (:mod:`~kiln.training.optimizer`) each
emit graph bindings, so they compose with any model function; :class:`Trainer` joins the model,
the loss, the gradient (``kiln.transform.Gradient``) and the optimizer update into one graph
function and compiles it with ``kiln.build``.
"""

from .loss import Loss, MSELoss, SoftmaxCrossEntropy, attach_loss, emit_body
from .optimizer import SGD, Adam, Optimizer
from .trainer import Trainer, make_train_module

__all__ = [
    "SGD", "Adam", "Loss", "MSELoss", "Optimizer", "SoftmaxCrossEntropy", "attach_loss",
    "Trainer", "emit_body", "make_train_module",
]
