"""errors.cause: a failure's cause kept in one line, whatever the error puts first."""

from tf_tput import errors

# The shape of TensorFlow's graph execution errors: the stack first, the cause last.
GRAPH_ERROR = ("Graph execution error:\n\nDetected at node 'einsum_12' defined at (most "
               "recent call last):\n" + "".join(
                   f'  File "/x/m{i}.py", line {i}, in f{i}\n' for i in range(60))
               + "Node: 'einsum_12'\nOOM when allocating tensor with shape[64,4096,4096]"
               "\n\t [[{{node einsum_12}}]]\n")


class ResourceExhaustedError(Exception):
  pass


def test_the_cause_comes_first_and_the_stack_is_left_out():
  text = errors.cause(ResourceExhaustedError(GRAPH_ERROR))
  assert text.startswith("ResourceExhaustedError: Node: 'einsum_12' OOM when allocating "
                         "tensor with shape[64,4096,4096]")
  assert "(after: Graph execution error: Detected at node 'einsum_12'" in text
  assert 'File "' not in text and "\n" not in text
  # one_line, which cuts the start, loses it: why failures are recorded with cause().
  assert "OOM" not in errors.one_line(ResourceExhaustedError(GRAPH_ERROR))


def test_a_long_cause_keeps_its_end_and_its_type():
  text = errors.cause(RuntimeError("x" * 5000 + " the end"), limit=200)
  assert len(text) == 200 and text.startswith("RuntimeError: …")
  assert text.endswith(" the end")


def test_a_plain_error_is_its_type_and_message():
  assert errors.cause(ValueError("bad\n  value")) == "ValueError: bad value"

