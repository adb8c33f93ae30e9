"""OpenDP's names as ``import opendp.prelude as dp`` gives them (``dp.m.make_laplace``,
``dp.atom_domain``, ``dp.enable_features``...), without the prelude's imports of
``opendp.extras`` (scikit-learn, polars and the rest: about a CPU second of every process's
start, the web's, each worker's and each site agent's, for names this project never uses).

    from engines import opendp_names as dp
"""

from opendp import combinators as c  # noqa: F401
from opendp import measurements as m  # noqa: F401
from opendp import transformations as t  # noqa: F401
from opendp.accuracy import *  # noqa: F401,F403
from opendp.domains import *  # noqa: F401,F403
from opendp.measures import *  # noqa: F401,F403
from opendp.metrics import *  # noqa: F401,F403
from opendp.mod import *  # noqa: F401,F403
