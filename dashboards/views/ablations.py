"""ablations page: being built."""
import streamlit as st

st.header("ablations")
st.info("This page is being built.")
