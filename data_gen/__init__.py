"""smolalign: data_gen, the data post-training needs (verifiable tasks, preference pairs).

Importing the package registers its builtin sources with align.data.loading by name (`builtin:tasks`), so the core
loads them without importing data_gen: every stage and script that loads data imports data_gen first.
"""

import data_gen.tasks  # noqa: F401  (registers builtin:tasks)
import data_gen.tool_tasks  # noqa: F401  (registers builtin:tool_tasks)
