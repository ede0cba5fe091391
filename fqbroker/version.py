"""Version numbers, kept apart so any module can import them without cycles."""

__version__ = "0.1.0"
# What /stats.json reports as "version": the fq release whose behaviour we follow.
FQ_COMPAT_VERSION = "0.13.12"
