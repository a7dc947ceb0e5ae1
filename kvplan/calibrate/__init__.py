"""Calibration from the user's own engine logs: read a vLLM or SGLang start-up log, set each measured figure beside
kvplan's prediction for the same deployment, and save what the box measured as a profile (`kvplan calibrate`).

text.py cleans pasted log text into records with their rank; vllm_log.py and sglang_log.py read each engine's
lines into a StartupLog (log.py); compare.py plans the same deployment and compares; profile.py builds, saves
and loads the BoxProfile that `kvplan estimate --profile` uses.
"""
