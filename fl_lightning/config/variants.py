"""A comparison's runs: a config's ``variants`` (each merged over it), crossed with its ``sweep`` grid.

Every run is built and validated here, before anything runs (:func:`expand_variants`); a run name tells swept
runs apart.
"""

from __future__ import annotations

from fl_lightning.config.history import current_names
from fl_lightning.config.loading import build_config, config_to_dict, switch_algorithm
from fl_lightning.config.schema import RunConfig
from fl_lightning.config.yaml_io import merge
from fl_lightning.errors import ConfigError, UsageError

__all__ = ["expand_variants"]


_NAMED_BY_DEFAULT = ("partition.alpha", "seed")  # keys the default run name already encodes


def _sweep_groups(sweep: dict) -> list[tuple[list[str], list[tuple]]]:
    """``sweep`` as groups of keys that vary together, each with its points (one value per key).

    A plain key (``seed: [0, 1, 2]``) is a group of one. A key that names several dotted keys joined by
    commas varies them together, one list of values per point, in the key's order:
    ``"seed,partition.seed": [[0, 0], [1, 1], [2, 2]]`` is three points, not nine. Groups are crossed.
    """
    groups: list[tuple[list[str], list[tuple]]] = []
    seen: dict[str, str] = {}
    for key, values in sweep.items():
        where = f"sweep.{key}"
        names = [part.strip() for part in str(key).split(",")]
        if any(not n for n in names):
            raise ConfigError(
                where, values, 'a dotted key, or dotted keys joined by commas (e.g. "seed,partition.seed"), none of them empty'
            )
        for name in names:
            if name in seen or names.count(name) > 1:
                raise UsageError(
                    f"config error: sweep: key {name!r} is swept twice ({where} and "
                    f"sweep.{seen.get(name, key)}); sweep each key in one entry"
                )
            seen[name] = str(key)
        if not isinstance(values, list) or not values:
            raise ConfigError(where, values, "a non-empty list of values")
        if len(names) == 1:
            groups.append((names, [(v,) for v in values]))
            continue
        for point in values:
            if not isinstance(point, list) or len(point) != len(names):
                raise ConfigError(
                    where,
                    point,
                    f"a list of {len(names)} values, one for each of {', '.join(names)} "
                    f"(e.g. {[[0] * len(names), [1] * len(names)]}): the keys vary together",
                )
        groups.append((names, [tuple(point) for point in values]))
    return groups


def _sweep_points(sweep: dict) -> list[tuple[dict, dict, dict]]:
    """The cross product of ``sweep``'s groups (see :func:`_sweep_groups`) as override trees, in a stable order:
    ``(tree, every swept key → value, the naming keys → value)``. A group's first key names its point in the
    run name (the others move with it)."""
    import itertools

    groups = _sweep_groups(sweep)
    points = []
    for combo in itertools.product(*(group_points for _, group_points in groups)):
        tree: dict = {}
        values: dict = {}
        naming: dict = {}
        for (names, _), point in zip(groups, combo):
            naming[names[0]] = point[0]
            for key, value in zip(names, point):
                values[key] = value
                node = tree
                *parents, last = key.split(".")
                for part in parents:
                    node = node.setdefault(part, {})
                node[last] = value
        points.append((tree, values, naming))
    return points


def _swept_name(run: RunConfig, named: str | None, values: dict) -> str | None:
    """A run name that tells swept runs apart: the default name encodes α and seed; other swept keys
    (and every swept key of an explicitly named variant) become suffixes."""
    suffix = "".join(
        f"_{key.rsplit('.', 1)[-1]}{value:g}" if isinstance(value, float) else f"_{key.rsplit('.', 1)[-1]}{value}"
        for key, value in values.items()
        if named is not None or key not in _NAMED_BY_DEFAULT
    )
    if named is None and not suffix:
        return None
    return (named or run.resolved_run_name) + suffix.replace("/", "-")


def expand_variants(cfg: RunConfig) -> list[RunConfig]:
    """The runs a config asks for: itself, or one per entry of ``variants`` (merged over it), each
    crossed with the ``sweep`` grid.

    A variant that switches ``algorithm`` keeps the base's method keys only where the two methods'
    configs share them by inheritance (AFL ⊂ FedOPAL); its own method keys go inside the variant.
    Every run is built and validated here, before anything runs.
    """
    if not cfg.variants and not cfg.sweep:
        return [cfg]
    base = config_to_dict(cfg)
    base["variants"], base["sweep"] = [], {}
    runs = []
    for i, variant in enumerate(cfg.variants or [{}]):
        if not isinstance(variant, dict):
            raise ConfigError(f"variants[{i}]", variant, "a mapping of config keys, e.g. {algorithm: afl}")
        variant = current_names(variant)
        values = switch_algorithm(base, variant.get("algorithm", cfg.algorithm))
        for tree, point, naming in _sweep_points(cfg.sweep) if cfg.sweep else [({}, {}, {})]:
            try:
                run = build_config(merge(merge(values, variant), tree))
            except UsageError as err:
                where = f"variants[{i}]" if cfg.variants else "sweep"
                raise UsageError(f"{err} (in {where}{f', sweep point {point}' if point else ''})") from None
            if run.label is None:
                run.label = variant.get("run_name") or run.algorithm
            name = _swept_name(run, variant.get("run_name") or cfg.run_name, naming)
            if name is not None:
                run.run_name = name
            runs.append(run)
    names = [r.resolved_run_name for r in runs]
    if len(set(names)) != len(names):
        raise ConfigError("variants", names, "distinct run names (set run_name in each variant)")
    return runs
