"""The math guides' reward: 1.0 when the number after the last ``####`` equals the answer."""

import re


def gsm8k_reward(response_text: str, ground_truth: str) -> float:
    found = re.findall(r"#### (\-?[0-9\.\,]+)", response_text[-300:])
    if not found:
        return 0.0
    return 1.0 if found[-1].replace(",", "").replace("$", "") == ground_truth else 0.0
