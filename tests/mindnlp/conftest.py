"""MindNLP first: importing it makes ``import torch`` mindtorch (a proxy), which the test
modules import at the top; and the stand-in for its two missing CPU kernels goes in once
for the whole process (``tests.mindnlp.support``)."""

import tests.mindnlp.support  # noqa: F401
